"""The small base class every lock backend implements.

Public methods validate their input and keep the held/lost bookkeeping; backends only
implement the ``do_*`` primitives (the redis-py ``Lock`` pattern). One instance stands for
one acquisition: it is never shared between threads or coroutines, so a token (or a
database session) always belongs to exactly one holder.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import (
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
)
from django_dbqueue.locks.renew import AutoRenew

logger = logging.getLogger("django_dbqueue.locks")

# Polling backoff while waiting for a busy lock: short first, then at most this often.
MIN_POLL = 0.005
MAX_POLL = 0.1


class BaseLock(ABC):
    """One acquisition of the named lock ``name`` (at most ``limit`` holders at once)."""

    #: Registry name ("redis", "mysql", "postgres").
    backend_name: ClassVar[str]
    #: True when a lock runs out after ``timeout`` seconds unless extended (a lease).
    expires: ClassVar[bool] = False

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        limit: int = 1,
        fencing: bool = False,
        using: str | None = None,
        on_lost: Callable[[BaseLock], object] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"A lock name must be a non-empty string, not {name!r}.")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1 (holders at once), not {limit!r}.")
        lease = settings.LOCK_TIMEOUT if timeout is None else timeout
        if not isinstance(lease, int | float) or lease <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, not {lease!r}.")
        self.name = name
        self.full_name = f"{settings.LOCK_PREFIX}{name}"
        self.timeout = float(lease)
        self.limit = limit
        self.fencing = fencing
        self.using = using
        self.on_lost = on_lost
        self.held = False
        self.lost = False
        #: With ``fencing=True``: a number larger than every earlier holder's, so a
        #: storage that remembers the largest token it saw can reject stale writers.
        self.fencing_token: int | None = None
        self.renewer: AutoRenew | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "free"
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} {state}>"

    # Public API ------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, blocking_timeout: float | None = None) -> bool:
        """Take the lock. Return False when it is busy and ``blocking`` is False or
        ``blocking_timeout`` seconds passed; ``None`` waits for as long as it takes."""
        if self.held:
            raise LockError(
                f"Lock {self.name!r} is already held by this object; use a new acquisition "
                "(a new named_lock() context) per holder."
            )
        if blocking_timeout is not None and (
            not isinstance(blocking_timeout, int | float) or blocking_timeout < 0
        ):
            raise ValueError(f"blocking_timeout must be seconds >= 0, not {blocking_timeout!r}.")
        deadline = None
        if not blocking:
            deadline = time.monotonic()
        elif blocking_timeout is not None:
            deadline = time.monotonic() + blocking_timeout
        pause = MIN_POLL
        while True:
            try:
                acquired = self.do_acquire()
            except BaseException:
                self.close()  # a half-made acquisition must not keep a session (or slot)
                raise
            if acquired:
                self.held, self.lost = True, False
                return True
            if deadline is not None and time.monotonic() >= deadline:
                self.close()
                return False
            # Polling (never a server-side wait) keeps every backend and the semaphore
            # slots alike; the backoff keeps a crowd of waiters cheap for the server.
            sleep = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(sleep)
            pause = min(pause * 2, MAX_POLL)

    def acquire_or_raise(
        self, blocking: bool = True, blocking_timeout: float | None = None
    ) -> None:
        if not self.acquire(blocking, blocking_timeout):
            raise self.not_acquired(blocking, blocking_timeout)

    def not_acquired(self, blocking: bool, blocking_timeout: float | None) -> LockNotAcquired:
        """The error for a lock that was busy until the caller gave up."""
        return LockNotAcquired(
            f"Lock {self.name!r} ({self.backend_name}, limit={self.limit}) is held by "
            + ("someone else" if self.limit == 1 else f"{self.limit} holders")
            + (
                f"; gave up after {blocking_timeout:g} s."
                if blocking and blocking_timeout is not None
                else "."
                if blocking
                else " and blocking=False."
            )
        )

    def release(self) -> None:
        """Give the lock back. Raise :class:`LockLost` if it was no longer ours (it was
        taken over or dropped in the meantime); the next holder's lock is never touched."""
        if not self.held:
            raise LockNotHeld(f"Lock {self.name!r} is not held by this object.")
        if self.renewer is not None:
            self.renewer.stop()
        self.held = False
        try:
            still_ours = self.do_release()
        finally:
            self.close()
        if not still_ours:
            self.mark_lost()
        if self.lost:
            raise LockLost(
                f"Lock {self.name!r} ({self.backend_name}) was lost before release: another "
                "holder may have run at the same time."
            )

    def extend(self, seconds: float | None = None) -> None:
        """Make the lease end ``seconds`` (default: ``timeout``) from now. For backends
        that do not expire this only checks that the lock is still held."""
        if not self.held:
            raise LockNotHeld(f"Lock {self.name!r} is not held by this object.")
        lease = self.timeout if seconds is None else seconds
        if not isinstance(lease, int | float) or lease <= 0:
            raise ValueError(f"seconds must be > 0, not {lease!r}.")
        if self.lost or not self.do_extend(lease):
            self.mark_lost()
            raise LockLost(f"Lock {self.name!r} ({self.backend_name}) was lost; cannot extend.")

    def start_auto_renew(self, interval: float | None = None) -> None:
        """Extend the lease every ``interval`` (default ``timeout / 3``) seconds from a
        daemon thread until release. Nothing to do for locks that do not expire."""
        if not self.expires or not self.held or self.renewer is not None:
            return
        self.renewer = AutoRenew(self, self.timeout / 3 if interval is None else interval)
        self.renewer.start()

    def owned(self) -> bool:
        """Ask the server whether this holder still has the lock (False once lost)."""
        if not self.held or self.lost:
            return False
        if not self.do_owned():
            self.mark_lost()
            return False
        return True

    def mark_lost(self) -> None:
        if self.lost:
            return
        self.lost = True
        logger.warning("Lock %r (%s) was lost by its holder.", self.name, self.backend_name)
        if self.on_lost is not None:
            self.on_lost(self)

    def address(self) -> str:
        """Where the backend's server is, for error messages (no credentials)."""
        return "?"

    def unavailable(self, error: BaseException) -> LockBackendUnavailable:
        """The error for a backend that cannot be reached: named, with its address."""
        return LockBackendUnavailable(
            f"Lock {self.name!r}: the {self.backend_name} lock backend at {self.address()} "
            f"cannot be reached ({type(error).__name__}: {error}). The lock fails closed: "
            "it is not held (see docs/locks.md, 'When the backend is down')."
        )

    def close(self) -> None:  # noqa: B027  (most backends hold nothing to free)
        """Free what the acquisition used (a dedicated connection); idempotent."""

    # Backend primitives ----------------------------------------------------------------

    @abstractmethod
    def do_acquire(self) -> bool:
        """One non-blocking attempt; on success set ``fencing_token`` if ``fencing``."""

    @abstractmethod
    def do_release(self) -> bool:
        """Release; return False if the lock was no longer ours (then touch nothing)."""

    @abstractmethod
    def do_owned(self) -> bool: ...

    def do_extend(self, seconds: float) -> bool:
        return self.do_owned()

    # Helpers for backends ----------------------------------------------------------------

    def slots(self) -> list[int | None]:
        """What to try in turn: ``None`` for a mutex, the slot numbers of a semaphore.
        Backends map (``full_name``, slot) to a key no other name or slot shares
        (locks/names.py)."""
        if self.limit == 1:
            return [None]
        return list(range(self.limit))
