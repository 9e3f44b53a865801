"""The admin room: job pages and dashboard, worker list; imported by admin autodiscovery."""

from django_dbqueue.admin import jobs, workers
from django_dbqueue.admin.jobs import JobAdmin  # documented for subclassing (docs/admin.md)
from django_dbqueue.admin.workers import WorkerAdmin

__all__ = ["JobAdmin", "WorkerAdmin", "jobs", "workers"]
