"""The documented ``TASKS`` path: ``django_dbqueue.backends.DBQueueBackend``."""

from django_dbqueue.tasks.backend import DBQueueBackend, DBQueueTask

__all__ = ["DBQueueBackend", "DBQueueTask"]
