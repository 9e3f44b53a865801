"""``named_lock``: one API over every backend, as a context manager and as a decorator,
for sync and async code alike."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import string
import threading
import warnings
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.utils.module_loading import import_string

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import (
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockReleasedBeforeCommit,
    LockReleasedBeforeCommitWarning,
    RetryJob,
)
from django_dbqueue.locks.base import MAX_POLL, MIN_POLL, BaseLock
from django_dbqueue.queue.dialects.galera import wsrep_on

logger = logging.getLogger("django_dbqueue.locks")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

BACKENDS = {
    "redis": "django_dbqueue.locks.redis.RedisLock",
    "mysql": "django_dbqueue.locks.mysql.MySQLLock",
    "galera": "django_dbqueue.locks.galera.GaleraLock",
    "postgres": "django_dbqueue.locks.postgres.PostgresLock",
}
RELEASE_MODES = ("warn", "raise", "ignore")

# Held locks of `async with` blocks, per task (a thread runs many): (named_lock, lock).
_held_async: ContextVar[tuple[tuple[Any, BaseLock], ...]] = ContextVar(
    "dbqueue_held_async", default=()
)
# Releases of acquisitions whose waiter was cancelled meanwhile (kept from the collector).
_abandoned: set[asyncio.Future[Any]] = set()


def in_sync_thread(func: Callable[..., T]) -> Callable[..., Coroutine[Any, Any, T]]:
    """``func`` for async code: run in the thread where Django's async ORM runs this
    code's queries (thread-sensitive), so a database lock's session and the caller's
    transaction are always on the same thread as the rest of its blocking work."""
    return sync_to_async(func, thread_sensitive=True)


def default_backend_name() -> str:
    """``DBQUEUE['LOCK_BACKEND']``, or when unset the lock database's own lock kind
    (GET_LOCK on MySQL/MariaDB, lease rows on a Galera cluster, advisory locks on
    PostgreSQL), else Redis."""
    configured = settings.LOCK_BACKEND
    if configured:
        return str(configured)
    conn = connections[settings.LOCK_DATABASE_ALIAS]
    if conn.vendor == "mysql":
        return "galera" if wsrep_on(conn) else "mysql"
    return {"postgresql": "postgres"}.get(conn.vendor, "redis")


def get_backend(name: str | None = None) -> type[BaseLock]:
    """The lock class for a backend name (default ``DBQUEUE['LOCK_BACKEND']``) or a
    dotted path to a :class:`BaseLock` subclass."""
    backend = name or default_backend_name()
    if backend not in BACKENDS and "." not in str(backend):
        raise ValueError(
            f"Unknown lock backend {backend!r}: use one of {', '.join(BACKENDS)} or the "
            "dotted path of a django_dbqueue.locks.base.BaseLock subclass."
        )
    cls = import_string(BACKENDS.get(backend, backend))
    if not (isinstance(cls, type) and issubclass(cls, BaseLock)):
        raise ValueError(f"Lock backend {backend!r} is not a BaseLock subclass.")
    return cls


def open_transactions() -> list[str]:
    """Aliases of this thread's connections with a transaction open (test-case wrappers
    excluded: they never commit)."""
    aliases = []
    for conn in connections.all(initialized_only=True):
        user_blocks = [b for b in conn.atomic_blocks if not getattr(b, "_from_testcase", False)]
        # Outside atomic(), autocommit off means set_autocommit(False): a manual transaction.
        manual = not conn.in_atomic_block and conn.connection is not None and not conn.autocommit
        if user_blocks or manual:
            aliases.append(conn.alias)
    return aliases


class named_lock:  # lower case: it reads like a function, `with named_lock(...)`
    """Mutual exclusion (or at most ``limit`` holders) across processes and hosts.

    ``with named_lock("report") as lock:`` gives the backend lock object (``lock.owned()``,
    ``lock.extend()``, ``lock.lost``, ``lock.fencing_token``). As a decorator the name may
    use the function's arguments: ``@named_lock("fetch:{item_id}")``, or be a callable
    taking the same arguments. When the lock is not acquired (busy, or its backend cannot
    be reached: the lock fails closed), ``on_fail`` decides: ``"raise"``
    (:class:`LockNotAcquired`, or :class:`LockBackendUnavailable`), ``"retry"``
    (:class:`RetryJob` so a job runs again later), an HTTP status such as 409/423/429 (a
    view returns that response), or a callable taking the function's arguments whose
    result is returned instead.
    """

    def __init__(
        self,
        name: str | Callable[..., str],
        *,
        backend: str | None = None,
        using: str | None = None,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        limit: int = 1,
        fencing: bool = False,
        auto_renew: bool = False,
        on_lost: Callable[[BaseLock], object] | None = None,
        on_fail: str | int | Callable[..., Any] = "raise",
        retry_delay: float = 10.0,
        release_in_transaction: str | None = None,
    ) -> None:
        if not (callable(name) or (isinstance(name, str) and name)):
            raise ValueError(f"A lock name must be a non-empty string or a callable, not {name!r}.")
        if not (
            on_fail in ("raise", "retry")
            or callable(on_fail)
            or (isinstance(on_fail, int) and 400 <= on_fail <= 599)
        ):
            raise ValueError(
                f"on_fail must be 'raise', 'retry', an HTTP status 400-599 or a callable, "
                f"not {on_fail!r}."
            )
        if release_in_transaction not in (None, *RELEASE_MODES):
            raise ValueError(f"release_in_transaction must be one of {RELEASE_MODES}.")
        self.name = name
        self.backend = backend
        self.options: dict[str, Any] = {
            "using": using,
            "timeout": timeout,
            "limit": limit,
            "fencing": fencing,
            "on_lost": on_lost,
        }
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.auto_renew = auto_renew
        self.on_fail = on_fail
        self.retry_delay = retry_delay
        self.release_in_transaction = release_in_transaction
        # Held locks of `with` blocks, per thread: one named_lock object may be shared
        # (a module-level constant) while every acquisition keeps its own token.
        self.local = threading.local()

    # Acquire / release -----------------------------------------------------------------

    def acquire(self, name: str) -> BaseLock:
        lock = get_backend(self.backend)(name, **self.options)
        lock.acquire_or_raise(self.blocking, self.blocking_timeout)
        if self.auto_renew:
            lock.start_auto_renew()
        return lock

    def release(self, lock: BaseLock, failing: bool) -> None:
        mode = self.release_in_transaction or settings.LOCK_RELEASE_IN_TRANSACTION
        # A failing block's transaction is about to roll back: nothing stale to read.
        open_aliases = [] if failing or mode == "ignore" else open_transactions()
        try:
            lock.release()
        except LockLost:
            if not failing:
                raise
            # Do not hide the exception that is already on its way out; mark_lost logged.
        if open_aliases:
            message = (
                f"Lock {lock.name!r} was released while a transaction on database "
                f"{', '.join(open_aliases)} is still open: the next holder can read the data "
                "from before this transaction's writes. Take the lock outside "
                "transaction.atomic() (and outside ATOMIC_REQUESTS), or pass "
                "release_in_transaction='ignore' if the lock guards no database writes."
            )
            if mode == "raise":
                raise LockReleasedBeforeCommit(message)
            warnings.warn(message, LockReleasedBeforeCommitWarning, stacklevel=3)

    # The same for async code ------------------------------------------------------------

    def _make(self, name: str) -> BaseLock:
        return get_backend(self.backend)(name, **self.options)

    async def aacquire(self, name: str) -> BaseLock:
        """:meth:`acquire` for async code: each attempt runs in the sync thread
        (:func:`in_sync_thread`), the waits between attempts on the event loop, so a
        waiter never holds up that thread (where the holder's release must run)."""
        # The backend is chosen in the sync thread too: on MariaDB the choice asks the
        # server whether it is a Galera node.
        lock = await in_sync_thread(self._make)(name)
        loop = asyncio.get_running_loop()
        wait = self.blocking_timeout if self.blocking else 0.0
        deadline = None if wait is None else loop.time() + wait
        pause = MIN_POLL
        while not await self._attempt(lock):
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise lock.not_acquired(self.blocking, self.blocking_timeout)
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, MAX_POLL)
        if self.auto_renew:
            lock.start_auto_renew()
        return lock

    async def _attempt(self, lock: BaseLock) -> bool:
        """One attempt; if the waiter is cancelled meanwhile, a lock it took is released."""
        attempt = asyncio.ensure_future(in_sync_thread(lock.acquire)(False, self.blocking_timeout))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            attempt.add_done_callback(functools.partial(_release_abandoned, lock))
            raise

    async def arelease(self, lock: BaseLock, failing: bool) -> None:
        """:meth:`release` for async code, carried out even if the task is cancelled."""
        releasing = asyncio.ensure_future(in_sync_thread(self.release)(lock, failing))
        await asyncio.shield(releasing)

    async def __aenter__(self) -> BaseLock:
        lock = await self.aacquire(self.fixed_name())
        _held_async.set((*_held_async.get(), (self, lock)))
        return lock

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held = _held_async.get()
        index = max(i for i, (owner, _) in enumerate(held) if owner is self)
        _held_async.set(held[:index] + held[index + 1 :])
        await self.arelease(held[index][1], failing=exc is not None)

    # Context manager -------------------------------------------------------------------

    def fixed_name(self) -> str:
        if not isinstance(self.name, str):
            raise TypeError("A lock name built from arguments only works as a decorator.")
        return self.name

    def __enter__(self) -> BaseLock:
        lock = self.acquire(self.fixed_name())
        stack: list[BaseLock] = self.local.__dict__.setdefault("stack", [])
        stack.append(lock)
        return lock

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release(self.local.stack.pop(), failing=exc is not None)

    # Decorator -------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        signature = inspect.signature(func)
        self.check_template(signature, func)
        if inspect.iscoroutinefunction(func):
            return self.wrap_async(func, signature)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = self.name_for(signature, args, kwargs)
            try:
                lock = self.acquire(name)
            except (LockNotAcquired, LockBackendUnavailable) as error:
                return self.not_acquired(error, args, kwargs)
            try:
                result = func(*args, **kwargs)
            except BaseException:
                self.release(lock, failing=True)
                raise
            self.release(lock, failing=False)
            return result

        return wrapper  # type: ignore[return-value]

    def wrap_async(self, func: F, signature: inspect.Signature) -> F:
        """The decorator for an ``async def`` (an async view, an async job)."""

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = self.name_for(signature, args, kwargs)
            try:
                lock = await self.aacquire(name)
            except (LockNotAcquired, LockBackendUnavailable) as error:
                answer = self.not_acquired(error, args, kwargs)
                return await answer if inspect.isawaitable(answer) else answer
            try:
                result = await func(*args, **kwargs)
            except BaseException:
                await self.arelease(lock, failing=True)
                raise
            await self.arelease(lock, failing=False)
            return result

        return wrapper  # type: ignore[return-value]

    def check_template(self, signature: inspect.Signature, func: Callable[..., Any]) -> None:
        if not isinstance(self.name, str):
            return
        takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        for _, field, _, _ in string.Formatter().parse(self.name):
            if field is None:
                continue
            root = field.split(".")[0].split("[")[0]
            if not root or (root not in signature.parameters and not takes_any):
                raise ValueError(
                    f"Lock name {self.name!r} uses {{{field}}}, but {func.__qualname__}() "
                    f"has no argument {root!r}. Name fields must be argument names, e.g. "
                    "'fetch:{item_id}' (double the braces for a literal one)."
                )

    def name_for(self, signature: inspect.Signature, args: Any, kwargs: Any) -> str:
        if callable(self.name):
            return str(self.name(*args, **kwargs))
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for param in signature.parameters.values():
            if param.kind is param.VAR_KEYWORD:
                arguments.update(arguments.pop(param.name, {}))
        return self.name.format(**arguments)

    def not_acquired(self, error: LockError, args: Any, kwargs: Any) -> Any:
        """What the decorated call gives when the lock is busy or its backend is down
        (then the lock fails closed: the function does not run either way)."""
        if isinstance(error, LockBackendUnavailable) and self.on_fail != "raise":
            logger.warning("%s", error)  # on_fail answers for it: say so once here
        if self.on_fail == "raise":
            raise error
        if self.on_fail == "retry":
            raise RetryJob(self.retry_delay, str(error)) from error
        if isinstance(self.on_fail, int):
            from django.http import HttpResponse

            # The lock name may contain ids or other internals: do not show it.
            response = HttpResponse(
                "This resource is busy; try again later.\n",
                status=self.on_fail,
                content_type="text/plain; charset=utf-8",
            )
            response["Retry-After"] = str(max(1, round(self.retry_delay)))
            return response
        assert callable(self.on_fail)
        return self.on_fail(*args, **kwargs)  # an async function's answer is awaited


def _release_abandoned(lock: BaseLock, attempt: asyncio.Future[bool]) -> None:
    """An attempt whose waiter was cancelled took the lock: give it back at once."""
    if attempt.cancelled() or attempt.exception() is not None or not attempt.result():
        return
    releasing = asyncio.ensure_future(in_sync_thread(lock.release)())
    _abandoned.add(releasing)
    releasing.add_done_callback(_forget)


def _forget(releasing: asyncio.Future[Any]) -> None:
    _abandoned.discard(releasing)
    if not releasing.cancelled() and releasing.exception() is not None:
        logger.warning("Lock released after its waiter was cancelled: %s", releasing.exception())
