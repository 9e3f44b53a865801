"""The admin room: jobs, dashboard, workers, concurrency keys, batches (autodiscovered)."""

from django_dbqueue.admin import batches, jobs, keys, workers
from django_dbqueue.admin.batches import BatchAdmin
from django_dbqueue.admin.jobs import JobAdmin  # documented for subclassing (docs/admin.md)
from django_dbqueue.admin.keys import ConcurrencyKeyAdmin
from django_dbqueue.admin.workers import WorkerAdmin

__all__ = [
    "BatchAdmin",
    "ConcurrencyKeyAdmin",
    "JobAdmin",
    "WorkerAdmin",
    "batches",
    "jobs",
    "keys",
    "workers",
]
