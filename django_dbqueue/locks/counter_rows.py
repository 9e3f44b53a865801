"""The ``dbqueue_counter`` rows: which row a counter or a lock's fencing tokens use, and
the one autocommit statement that advances a fencing row.

Rows are named so that two counters share a row only when their names are equal, under
any collation (MySQL's default ones ignore case, trailing spaces and control characters),
and no counter reaches the fencing tokens of a lock (see :func:`counter_row`). The
backends (Redis for its epochs, MySQL and PostgreSQL for their tokens) and the counters
of ``counters.py`` all stand on this module.
"""

from __future__ import annotations

import re
from typing import Protocol

from django.db import connections

from django_dbqueue.locks.names import readable, tagged_digest
from django_dbqueue.queue.conflicts import retry_quietly

# Row names kept as they are: the same string under every collation, no "~" (which every
# hashed row has), and short enough for the 255-character column.
PLAIN_ROW = re.compile(r"[a-z0-9_.:-]{1,255}\Z")
FENCE = "fence:"

# One autocommit statement that adds one to a dbqueue_counter row (made at 1) and gives
# the new value back, per vendor; MySQL hands it back through LAST_INSERT_ID(expr), to
# this session only. The fencing tokens of the database locks, and the epochs of Redis's.
FENCE_UPSERT = {
    "mysql": (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, LAST_INSERT_ID(1)) "
        "ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)"
    ),
    "postgresql": (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, 1) "
        "ON CONFLICT (name) DO UPDATE SET value = dbqueue_counter.value + 1 RETURNING value"
    ),
    "sqlite": (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, 1) "
        "ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value"
    ),
}
MYSQL_READ_BACK = "SELECT LAST_INSERT_ID()"


def counter_row(name: str, *, fencing: bool = False) -> str:
    """The ``dbqueue_counter`` row of counter ``name`` (``fencing``: of the fencing tokens
    of the lock whose full name is ``name``).

    A fencing row is ``fence:<full name>`` and a counter's is its name when that is plain
    (lower-case ASCII letters, digits, ``_.:-``); a counter named ``fence:...`` never is.
    Every other name becomes a readable part, ``~`` and the SHA-256 of the name tagged with
    its kind, so neither kind can reach the other's rows.
    """
    plain = FENCE + name if fencing else name
    if PLAIN_ROW.match(plain) and (fencing or not name.startswith(FENCE)):
        return plain
    digest = tagged_digest("fence" if fencing else "counter", name)
    return f"{readable(plain, 255 - 1 - len(digest))}~{digest}"


class Session(Protocol):
    def query(self, sql: str, params: list[object]) -> object: ...


def mysql_fence_next(session: Session, row: str) -> int:
    """Advance fencing row ``row`` through a lock's own MySQL session and return the new
    value. A Galera node refuses the write at commit (1213) when another node advanced the
    row first: tried again, never raised (:func:`retry_quietly`)."""
    retry_quietly("fencing token", lambda: session.query(FENCE_UPSERT["mysql"], [row]))
    return int(str(session.query(MYSQL_READ_BACK, [])))


def durable_increment(alias: str, row: str) -> int:
    """Add one to ``dbqueue_counter`` row ``row`` of database ``alias`` and return the new
    value, on a connection of its own in autocommit: the value is committed when this
    returns, whatever transaction the caller is in (it never rolls back with it)."""
    connection = connections.create_connection(alias)
    try:
        vendor = connection.vendor
        with connection.cursor() as cursor:
            retry_quietly("fencing epoch", lambda: cursor.execute(FENCE_UPSERT[vendor], [row]))
            if vendor == "mysql":
                cursor.execute(MYSQL_READ_BACK)
            found = cursor.fetchone()
        assert found is not None
        return int(found[0])
    finally:
        connection.close()
