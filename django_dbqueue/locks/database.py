"""What the MySQL and PostgreSQL backends share: a session lock on a dedicated connection.

``GET_LOCK`` and session advisory locks belong to a database session. Django closes the
request's connection at the end of every request (and ``close_old_connections`` does the
same in workers), which would silently drop a lock taken on it. So each acquisition opens
its own connection from the same ``DATABASES`` entry, outside Django's connection
handler: nothing but :meth:`DatabaseLock.close` ever closes it, and it is in autocommit
mode, so the lock never depends on the caller's transactions.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.conf import settings
from django_dbqueue.locks.base import BaseLock
from django_dbqueue.locks.counter_rows import counter_row


class DatabaseLock(BaseLock):
    #: Django's ``connection.vendor`` this backend needs.
    vendor: ClassVar[str]

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.alias: str = self.using or settings.LOCK_DATABASE_ALIAS
        vendor = connections[self.alias].vendor
        if vendor != self.vendor:
            raise ValueError(
                f"The {self.backend_name} lock backend needs a {self.vendor} database, but "
                f"DATABASES[{self.alias!r}] is {vendor}. Choose a matching backend (or "
                "'redis') with DBQUEUE['LOCK_BACKEND'] or named_lock(backend=...)."
            )
        self.connection: BaseDatabaseWrapper | None = None
        #: The server-side key of the slot this acquisition holds.
        self.key: Any = None

    def session(self) -> BaseDatabaseWrapper:
        """The dedicated connection, opened on first use."""
        if self.connection is None:
            self.connection = connections.create_connection(self.alias)
            try:
                self.connection.ensure_connection()
            except DatabaseError as exc:
                # Only a failure to connect: errors of a session that was open are the
                # lock's to interpret (a killed session has lost its lock).
                raise self.unavailable(exc) from exc
        return self.connection

    def query(self, sql: str, params: list[Any]) -> Any:
        """First column of the first row, on the dedicated connection."""
        with self.session().cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return row[0] if row else None

    def execute(self, sql: str, params: list[Any]) -> int:
        """The rows a statement matched, on the dedicated connection."""
        with self.session().cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def address(self) -> str:
        params = connections[self.alias].settings_dict
        where = f"{params.get('HOST') or 'localhost'}:{params.get('PORT') or 'default port'}"
        return f"{where} (database {self.alias!r}, {params.get('NAME')!r})"

    def do_acquire(self) -> bool:
        for slot in self.slots():
            key = self.lock_key(slot)
            if self.try_lock(key):
                self.key = key
                if self.fencing:
                    counter = counter_row(self.full_name, fencing=True)
                    self.fencing_token = self.query_token(counter)
                return True
        return False

    def do_release(self) -> bool:
        return self.ask_session(self.unlock)

    def do_owned(self) -> bool:
        return self.ask_session(self.is_mine)

    def ask_session(self, question: Callable[[Any], bool]) -> bool:
        assert self.key is not None
        try:
            return question(self.key)
        except DatabaseError:
            # The session is gone (killed, server restarted, network): so is its lock.
            return False

    def close(self) -> None:
        if self.connection is not None:
            connection, self.connection = self.connection, None
            try:
                connection.close()
            except DatabaseError:
                pass  # already dead; closing it was all we wanted

    @abstractmethod
    def query_token(self, counter: str) -> int:
        """Next value of ``dbqueue_counter`` row ``counter``, in one autocommit statement:
        the token must not roll back with (or wait for) the caller's transaction."""

    @abstractmethod
    def lock_key(self, slot: int | None) -> Any:
        """The server's key for ``slot`` of this lock (``None``: the mutex)."""

    @abstractmethod
    def try_lock(self, key: Any) -> bool: ...

    @abstractmethod
    def unlock(self, key: Any) -> bool: ...

    @abstractmethod
    def is_mine(self, key: Any) -> bool: ...
