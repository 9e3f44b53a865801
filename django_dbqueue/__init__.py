"""django-dbqueue: a job queue, named locks and admin pages in your Django database."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The registry imports no models: @job works while the apps are still loading.
from django_dbqueue.registry import job

if TYPE_CHECKING:
    from django_dbqueue.models import Batch, Job

__all__ = ["aenqueue", "aenqueue_many", "enqueue", "enqueue_batch", "enqueue_many", "job"]
__version__ = "0.1.0"


def enqueue(task: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Job:
    """Add one job to the queue; see :func:`django_dbqueue.enqueueing.enqueue`."""
    # Imported lazily: the package must be importable before the app registry is ready.
    from django_dbqueue.enqueueing import enqueue as _enqueue

    return _enqueue(task, args, kwargs, **options)


def enqueue_many(jobs: Any, /, **options: Any) -> list[Job]:
    """Add many jobs in one batch; see :func:`django_dbqueue.bulk.enqueue_many`."""
    from django_dbqueue.bulk import enqueue_many as _enqueue_many

    return _enqueue_many(jobs, **options)


async def aenqueue(task: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Job:
    """:func:`enqueue` for async code; see :func:`django_dbqueue.enqueueing.aenqueue`."""
    from django_dbqueue.enqueueing import aenqueue as _aenqueue

    return await _aenqueue(task, args, kwargs, **options)


async def aenqueue_many(jobs: Any, /, **options: Any) -> list[Job]:
    """:func:`enqueue_many` for async code; see :func:`django_dbqueue.bulk.aenqueue_many`."""
    from django_dbqueue.bulk import aenqueue_many as _aenqueue_many

    return await _aenqueue_many(jobs, **options)


def enqueue_batch(jobs: Any, /, **callbacks: Any) -> Batch:
    """Enqueue jobs as one batch with callbacks that run exactly once; see
    :func:`django_dbqueue.workflows.batches.enqueue_batch`."""
    from django_dbqueue.workflows.batches import enqueue_batch as _enqueue_batch

    return _enqueue_batch(jobs, **callbacks)
