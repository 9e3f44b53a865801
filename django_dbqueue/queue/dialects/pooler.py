"""Whether a PostgreSQL alias goes through a pooler in transaction (or statement) mode,
such as PgBouncer's ``pool_mode = transaction``.

Such a pooler lends a server connection to a client for one transaction only, so
whatever belongs to a session is lost or shared with strangers: ``LISTEN`` (the wake-up
never arrives), session advisory locks (a second client is handed the server connection
that holds the first one's lock, and takes it again). docs/databases.md, "Poolers".

The probe (:func:`transaction_pooled`) opens two connections of its own:

1. ``A`` runs ``LISTEN`` on a private channel and reads its backend's pid, in one
   autocommit transaction: the pooler may now lend that backend to anyone.
2. ``B`` opens a transaction and reads its backend's pid, and keeps it open. A pooler
   usually lends it the backend ``A`` just gave back (PgBouncer reuses the most recently
   released one first): the same pid in two client connections means pooled.
3. While ``B`` holds its backend, ``A`` reads its pid and ``pg_listening_channels()``
   again: a changed pid, or a channel gone, means pooled.

A direct (or session-pooled) connection keeps one backend for its life: step 3 sees
the same pid and the channel, and ``B`` has a pid of its own. A statement-mode pooler
refuses ``B``'s transaction, which counts as pooled too. The answer is kept per alias
for the life of the process (forked children inherit it): a server does not move
behind a pooler while a process runs.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import OperationalError, connections

# alias -> pooled? (asked once per process)
_verdicts: dict[str, bool] = {}


def own_connection(alias: str, **options: Any) -> Any:
    """A psycopg connection of its own (autocommit) to PostgreSQL alias ``alias``, outside
    Django's connection handler (the wake-up listener's, the probe's)."""
    import psycopg

    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True, **options)


def transaction_pooled(alias: str) -> bool:
    """True when PostgreSQL alias ``alias`` reaches its server through a pooler that
    lends server connections per transaction. Raises Django's ``OperationalError`` when
    the server cannot be reached (not known yet: asked again next time)."""
    if alias in _verdicts:
        return _verdicts[alias]
    if connections[alias].vendor != "postgresql":
        _verdicts[alias] = False
        return False
    import psycopg

    try:
        verdict = _probe(alias)
    except psycopg.Error as exc:
        raise OperationalError(str(exc)) from exc
    _verdicts[alias] = verdict
    return verdict


def _probe(alias: str) -> bool:
    import psycopg
    from psycopg import sql

    channel = f"dbqueue_probe_{uuid.uuid4().hex}"
    with own_connection(alias) as first, own_connection(alias) as second:
        try:
            with first.transaction():
                first.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                before = _one(first, "SELECT pg_backend_pid()")
            with second.transaction():
                if _one(second, "SELECT pg_backend_pid()") == before:
                    return True
                after = _one(first, "SELECT pg_backend_pid()")
                listening = _one(
                    first, "SELECT %s = ANY(ARRAY(SELECT pg_listening_channels()))", [channel]
                )
        except psycopg.Error as exc:
            if "pooling mode" in str(exc):  # PgBouncer in statement mode refuses BEGIN
                return True
            raise
        first.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
        return bool(after != before or not listening)


def _one(conn: Any, query: str, params: list[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def forget() -> None:
    """Ask again at the next :func:`transaction_pooled` (the tests)."""
    _verdicts.clear()
