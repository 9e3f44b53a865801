"""Which :class:`~.base.Dialect` a connection speaks: chosen once per connection and kept
on it, so the queue's hot path (claim, finish, insert) pays one attribute read."""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.dialects.base import Dialect
from django_dbqueue.queue.dialects.mysql import MySQL
from django_dbqueue.queue.dialects.postgresql import PostgreSQL
from django_dbqueue.queue.dialects.sqlite import SQLite

# One stateless object per database; any other backend gets the portable SQL.
BY_VENDOR: dict[str, Dialect] = {d.vendor: d for d in (MySQL(), PostgreSQL(), SQLite())}
PORTABLE = Dialect()


def dialect(conn: BaseDatabaseWrapper) -> Dialect:
    """The dialect of ``conn`` (a Django connection), chosen on its first use."""
    try:
        return conn._dbqueue_dialect  # type: ignore[attr-defined,no-any-return]
    except AttributeError:
        chosen = conn._dbqueue_dialect = BY_VENDOR.get(conn.vendor, PORTABLE)  # type: ignore[attr-defined]
        return chosen
