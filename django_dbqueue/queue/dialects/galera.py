"""Whether a connection's server is a node of a MariaDB Galera Cluster (``@@wsrep_on``).

On Galera every node takes writes; a transaction runs on its own node and is certified
cluster-wide at commit, where one that wrote a row another node changed meanwhile is
rolled back with error 1213 (the deadlock code: :func:`~.errors.is_lock_conflict` says
yes to it, and the queue retries it where it retries deadlocks). What stays node-local:
``GET_LOCK`` (so the mysql lock backend, refused there: the galera one is exclusive
cluster-wide), row locks (``FOR UPDATE SKIP LOCKED`` skips only this node's), and
``LAST_INSERT_ID()``. docs/databases.md, "MariaDB Galera Cluster".
"""

from __future__ import annotations

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper


def wsrep_on(conn: BaseDatabaseWrapper) -> bool:
    """True when ``conn`` (a Django connection) is to a Galera node with replication on.

    Asked once per connection object and kept on it: a server does not change kind
    under a running process. MySQL and SQLite/PostgreSQL are never Galera (MySQL has no
    ``wsrep_on`` variable, so the statement returns no row there).
    """
    try:
        return bool(conn._dbqueue_wsrep)  # type: ignore[attr-defined]
    except AttributeError:
        pass
    found = False
    if conn.vendor == "mysql":
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
                row = cursor.fetchone()
        except DatabaseError:
            return False  # not known yet (the server is away): ask again next time
        found = bool(row) and str(row[1]).upper() == "ON"
    conn._dbqueue_wsrep = found  # type: ignore[attr-defined]
    return found


#: The server variables docs/databases.md's Galera section recommends, and their values.
RECOMMENDED = {"innodb_autoinc_lock_mode": "2", "wsrep_sync_wait": "1"}


def node_settings(conn: BaseDatabaseWrapper) -> dict[str, str]:
    """The node's values of :data:`RECOMMENDED`'s variables (for ``check``)."""
    with conn.cursor() as cursor:
        cursor.execute("SHOW VARIABLES WHERE Variable_name IN (%s, %s)", list(RECOMMENDED))
        return {str(name): str(value) for name, value in cursor.fetchall()}
