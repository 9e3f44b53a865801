"""Galera locks: a lease row per lock in ``dbqueue_lock``, exclusive across the cluster.

``GET_LOCK`` is local to one Galera node, so the mysql backend would let a holder on each
node in at once. Here a lock is a row (name, owner, lease end) written in one autocommit
statement; two nodes that both write the row of a free lock both commit locally, but
certification lets only the first writeset through and rolls the other back with 1213:
that acquirer sees a busy lock and polls again. A lock held on another node is a row
whose lease has not run out, which this node sees once it applied that writeset (the
certification of any write of ours to the row waits for it). So at most one holder per
row, cluster-wide.

Leases run on the database's clock (``UTC_TIMESTAMP(6)`` of the node asked); a holder
keeps its lock with ``extend()`` or ``auto_renew=True``, as on Redis, and one whose lease
ran out finds out (``owned()`` is False, ``release()`` raises ``LockLost``). The nodes'
clocks must agree (NTP) to well under the lease. Names are the mysql backend's 64
hashed characters (:func:`~django_dbqueue.locks.mysql.get_lock_name`); a semaphore of N
tries its N slot rows in turn. Fencing tokens come from ``dbqueue_counter`` as on MySQL,
retried through certification conflicts.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import DatabaseError

from django_dbqueue.locks.counter_rows import mysql_fence_next
from django_dbqueue.locks.database import DatabaseLock
from django_dbqueue.locks.mysql import get_lock_name
from django_dbqueue.queue.conflicts import note_conflict, retry_quietly
from django_dbqueue.queue.dialects import is_lock_conflict

# A free or expired row becomes ours; a live one is left alone. MariaDB assigns from left
# to right, so expires_at sees the owner just written: it moves only if the row is ours.
TAKE = (
    "INSERT INTO dbqueue_lock (name, owner, expires_at) "
    "VALUES (%s, %s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND) "
    "ON DUPLICATE KEY UPDATE "
    "owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner), "
    "expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)"
)
HOLDER = "SELECT owner FROM dbqueue_lock WHERE name = %s"
OWNED = (
    "SELECT COUNT(*) FROM dbqueue_lock "
    "WHERE name = %s AND owner = %s AND expires_at > UTC_TIMESTAMP(6)"
)
EXTEND = (
    "UPDATE dbqueue_lock SET expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND "
    "WHERE name = %s AND owner = %s AND expires_at > UTC_TIMESTAMP(6)"
)
RELEASE = (
    "DELETE FROM dbqueue_lock WHERE name = %s AND owner = %s AND expires_at > UTC_TIMESTAMP(6)"
)
DROP_EXPIRED = "DELETE FROM dbqueue_lock WHERE name = %s AND owner = %s"


class GaleraLock(DatabaseLock):
    backend_name = "galera"
    vendor = "mysql"
    expires = True

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.owner = uuid.uuid4().hex  # this acquisition's token (32 characters)

    def micros(self, seconds: float) -> int:
        return max(1, round(seconds * 1_000_000))

    def query_token(self, counter: str) -> int:
        return mysql_fence_next(self, counter)

    def lock_key(self, slot: int | None) -> str:
        return get_lock_name(self.full_name, slot)

    def try_lock(self, key: str) -> bool:
        try:
            self.execute(TAKE, [key, self.owner, self.micros(self.timeout)])
        except DatabaseError as exc:
            if not is_lock_conflict(exc):
                raise
            # Another node wrote the row first (or a local writer holds it): busy now.
            note_conflict("galera lock", exc)
            return False
        return bool(self.query(HOLDER, [key]) == self.owner)

    def do_acquire(self) -> bool:
        try:
            return super().do_acquire()
        except BaseException:
            if self.key is not None:  # the row is ours but its fencing token is not
                self.ask_session(self.unlock)
            raise

    def unlock(self, key: str) -> bool:
        mine = retry_quietly("galera lock", lambda: self.execute(RELEASE, [key, self.owner]))
        if not mine:  # ours but expired (nobody took it over): tidy it away
            retry_quietly("galera lock", lambda: self.execute(DROP_EXPIRED, [key, self.owner]))
        return bool(mine)

    def is_mine(self, key: str) -> bool:
        return bool(self.query(OWNED, [key, self.owner]))

    def do_extend(self, seconds: float) -> bool:
        key = self.key
        return self.ask_session(
            lambda _: bool(
                retry_quietly(
                    "galera lock",
                    lambda: self.execute(EXTEND, [self.micros(seconds), key, self.owner]),
                )
            )
        )
