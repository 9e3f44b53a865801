"""Every error the app raises on purpose derives from :class:`DBQueueError`."""


class DBQueueError(Exception):
    """Base class for django-dbqueue errors."""


class InvalidJob(DBQueueError, ValueError):
    """enqueue() was given something that cannot be stored or run; nothing was written."""


class TaskNotFound(InvalidJob):
    """A task path does not name an importable callable."""


# The two interruptions below derive from BaseException on purpose: a job's own
# ``except Exception:`` must not swallow them and carry on past its deadline.
class JobTimeout(BaseException):
    """Raised inside a job that ran longer than its timeout."""


class WorkerShutdown(BaseException):
    """Raised inside a running job when the worker is told to stop at once (second signal)."""


class LeaseLost(DBQueueError):
    """This worker no longer owns the job: its lease ran out and another worker took it over."""
