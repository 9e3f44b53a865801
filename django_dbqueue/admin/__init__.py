"""The admin room: job pages and dashboard, worker list; imported by admin autodiscovery."""

from django_dbqueue.admin import jobs, workers

__all__ = ["jobs", "workers"]
