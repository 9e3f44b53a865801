"""PostgreSQL locks: session advisory locks on a dedicated connection.

The key is the first 64 bits of the SHA-256 of the lock name (or of the tagged slot of a
semaphore, locks/names.py) as a signed bigint: stable across processes and Python versions
(unlike ``hash()``), and any str is a name (the server never sees it). There is no
wait-with-timeout form of ``pg_advisory_lock``, so waiting is the base class's polling
of ``pg_try_advisory_lock`` with backoff. Advisory locks are per database.

Behind a pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) a session
lock stays on a server connection the pooler then lends to other clients: they would be
handed the lock as well, and could release it. The first acquisition in a process probes
the alias (:mod:`~django_dbqueue.queue.dialects.pooler`) and, when it is pooled that
way, every acquisition raises :class:`~django_dbqueue.exceptions.LockConfigurationError`
naming what works instead. Transaction-level advisory locks held in an open transaction
would be exclusive, but each holder would pin one of the pooler's server connections for
as long as it holds the lock, and holders that query through the same pool while others
hold theirs could wait on each other until the pooler's timeouts: refused, not offered.
"""

from __future__ import annotations

from django.db import DatabaseError

from django_dbqueue.exceptions import LockConfigurationError
from django_dbqueue.locks.counter_rows import FENCE_UPSERT
from django_dbqueue.locks.database import DatabaseLock
from django_dbqueue.locks.names import lock_digest
from django_dbqueue.queue.dialects.pooler import transaction_pooled


def advisory_key(full_name: str, slot: int | None) -> int:
    """The advisory lock key of lock ``full_name`` (``slot``: of that semaphore slot)."""
    return int.from_bytes(lock_digest(full_name, slot)[:8], "big", signed=True)


class PostgresLock(DatabaseLock):
    backend_name = "postgres"
    vendor = "postgresql"
    fencing_sql = FENCE_UPSERT["postgresql"]

    def query_token(self, counter: str) -> int:
        return int(self.query(self.fencing_sql, [counter]))

    def do_acquire(self) -> bool:
        try:
            pooled = transaction_pooled(self.alias)
        except DatabaseError as exc:
            raise self.unavailable(exc) from exc
        if pooled:
            raise LockConfigurationError(
                f"Lock {self.name!r}: database {self.alias!r} ({self.address()}) goes "
                "through a pooler in transaction mode (such as PgBouncer's pool_mode = "
                "transaction), which would lend this lock's session to other clients: two "
                "holders at once. Use the 'redis' lock backend, point "
                "DBQUEUE['LOCK_DATABASE_ALIAS'] at an alias that reaches PostgreSQL "
                "directly, or pool that alias in session mode (docs/locks.md, 'Poolers')."
            )
        return super().do_acquire()

    def lock_key(self, slot: int | None) -> int:
        return advisory_key(self.full_name, slot)

    def try_lock(self, key: int) -> bool:
        return self.query("SELECT pg_try_advisory_lock(%s)", [key]) is True

    def unlock(self, key: int) -> bool:
        return self.query("SELECT pg_advisory_unlock(%s)", [key]) is True

    def is_mine(self, key: int) -> bool:
        # A bigint advisory key shows in pg_locks as classid (high 32 bits) and objid
        # (low 32 bits) with objsubid 1.
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        return (
            self.query(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid() AND granted AND objsubid = 1 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND classid = %s::bigint::oid AND objid = %s::bigint::oid)",
                [unsigned >> 32, unsigned & 0xFFFFFFFF],
            )
            is True
        )

    def backend_pid(self) -> int:
        """This holder's server process id (what ``pg_terminate_backend`` takes)."""
        return int(self.query("SELECT pg_backend_pid()", []))
