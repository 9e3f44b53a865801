"""Every error the app raises on purpose derives from :class:`DBQueueError`."""


class DBQueueError(Exception):
    """Base class for django-dbqueue errors."""


class InvalidJob(DBQueueError, ValueError):
    """enqueue() was given something that cannot be stored or run; nothing was written."""


class InvalidJobArguments(InvalidJob, TypeError):
    """A job's arguments are not JSON. Also a TypeError: what Django's Tasks framework
    raises for the same mistake."""


class TaskNotFound(InvalidJob, ImportError):
    """A task path does not name a task that can run.

    Also an ImportError: recorded as a task's error, it reads as what it is.
    """


class UnregisteredTask(TaskNotFound):
    """The task is not in the registry: not decorated with ``@job`` (nor a Django Tasks
    ``@task``), or its module is not one the task discovery imports. Never retried."""


# The two interruptions below derive from BaseException on purpose: a job's own
# ``except Exception:`` must not swallow them and carry on past its deadline.
class JobTimeout(BaseException):
    """Raised inside a job that ran longer than its timeout."""


class WorkerShutdown(BaseException):
    """Raised inside a running job when the worker is told to stop at once (second signal)."""


class JobCancelled(BaseException):
    """Raised inside a running job whose cancellation an operator requested."""


class CrossDatabaseEnqueue(DBQueueError):
    """enqueue() inside a transaction of another database than the queue's (with
    ``DBQUEUE['CROSS_DATABASE_ENQUEUE'] = "raise"``): that transaction's rollback would
    not take the job back."""


class CrossDatabaseEnqueueWarning(RuntimeWarning):
    """The same, with the default ``"warn"``."""


class ActionConflict(DBQueueError):
    """An operator action (requeue, cancel, run now, delete) kept running into other
    writers (deadlocks, lock wait timeouts) after its retries. The statement that failed
    was rolled back; run the action again."""


class LeaseLost(DBQueueError):
    """This worker no longer owns the job: its lease ran out and another worker took it over."""


class RetryJob(DBQueueError):
    """Raise from a job to run it again later without counting a failed attempt.

    Used, for example, when a job cannot get a named lock: it is not broken, just early.
    """

    def __init__(self, delay: float = 10.0, reason: str = "") -> None:
        if delay < 0:
            raise ValueError("delay must be >= 0 seconds")
        self.delay = float(delay)
        self.reason = reason
        super().__init__(reason or f"retry in {delay:g} s")


class LockError(DBQueueError):
    """Base class for named-lock errors."""


class LockConfigurationError(LockError):
    """The settings name a lock backend that cannot work here (for example a Redis lock
    backend whose cache alias is not a django-redis cache)."""


class LockNotAcquired(LockError):
    """The lock is held by someone else (or all ``limit`` slots are taken) and waiting
    was not allowed or ran past ``blocking_timeout``."""


class LockLost(LockError):
    """The holder no longer owns the lock: its lease expired, its database session ended,
    or its key was deleted. Work done since then may have overlapped with another holder."""


class LockBackendUnavailable(LockError):
    """The lock's backend (Redis, or the lock database) cannot be reached. The lock fails
    closed: it is not held, so nothing it guards may run. ``named_lock``'s ``on_fail``
    decides what the caller gets, as for a busy lock."""


class LockNotHeld(LockError):
    """release() or extend() was called on a lock that this object does not hold."""


class LockReleasedBeforeCommit(LockError):
    """A lock was released while a database transaction was still open: the next holder
    can read data from before this transaction's writes. Raised when
    ``DBQUEUE['LOCK_RELEASE_IN_TRANSACTION']`` is ``"raise"``."""


class LockReleasedBeforeCommitWarning(RuntimeWarning):
    """Warning twin of :class:`LockReleasedBeforeCommit` (the default, ``"warn"``)."""


class ScheduleError(DBQueueError, ValueError):
    """An entry of ``DBQUEUE['SCHEDULE']`` cannot be used; ``name`` says which one (None:
    the setting as a whole) and ``field`` which of its keys (None: the entry as a whole)."""

    def __init__(
        self, name: object, message: str, field: str | None = None, where: str | None = None
    ) -> None:
        self.name = name
        self.message = message
        self.field = field
        # where: the declaration, when not the setting (a @job(schedule=...)).
        self.where = where or "DBQUEUE['SCHEDULE']" + ("" if name is None else f"[{name!r}]")
        super().__init__(f"{self.where}: {message}")
