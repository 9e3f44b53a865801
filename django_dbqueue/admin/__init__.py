"""The admin room: job pages and dashboard, worker list, concurrency keys (autodiscovered)."""

from django_dbqueue.admin import jobs, keys, workers
from django_dbqueue.admin.jobs import JobAdmin  # documented for subclassing (docs/admin.md)
from django_dbqueue.admin.keys import ConcurrencyKeyAdmin
from django_dbqueue.admin.workers import WorkerAdmin

__all__ = ["ConcurrencyKeyAdmin", "JobAdmin", "WorkerAdmin", "jobs", "keys", "workers"]
