"""enqueue_batch(): jobs enqueued as one batch, and callbacks that run exactly once when
the last of them ends (docs/workflows.md).

The members are inserted as ``enqueue_many`` inserts them, then marked as the batch's
in the same transaction; the callbacks are validated now and kept on the batch row, to
be inserted by the one transaction that completes the batch (``queue/batches.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import router, transaction

from django_dbqueue import registry
from django_dbqueue.bulk import JobSpec, enqueue_many
from django_dbqueue.enqueueing import build_job
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Batch, Job
from django_dbqueue.queue import batches

# What a callback job keeps of its validated Job (it runs once, when the batch ends).
CALLBACK_FIELDS = (
    "task",
    "queue",
    "priority",
    "max_attempts",
    "timeout",
    "retry_backoff",
    "args",
    "kwargs",
    "backend",
    "concurrency_key",
    "concurrency_limit",
)
_NOT_FOR_CALLBACKS = ("run_after", "unique_key", "depends_on", "on_dependency_failure")


def enqueue_batch(
    jobs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    on_complete: Any = None,
    on_success: Any = None,
    on_failure: Any = None,
    close: bool = True,
) -> Batch:
    """Enqueue ``jobs`` (as :func:`~django_dbqueue.enqueue_many` takes them) as one batch.

    When every member has ended, ``on_complete`` is enqueued, and ``on_success`` if all
    ended DONE or ``on_failure`` if not: each once, with the keyword argument ``batch``
    (``{"id", "total", "done", "failed", "cancelled"}``). Each callback is a task or a
    dict like an ``enqueue_many`` item. With ``close=False`` more members can be added
    (:func:`add_to_batch`) until :func:`close_batch`. Bad input raises InvalidJob and
    writes nothing.
    """
    callbacks = {
        name: callback_fields(spec)
        for name, spec in (
            ("on_complete", on_complete),
            ("on_success", on_success),
            ("on_failure", on_failure),
        )
        if spec is not None
    }
    using = router.db_for_write(Job)
    with transaction.atomic(using=using):
        batch: Batch = batches.create(using, callbacks, closed=False)
        add_to_batch(batch, jobs)
        if close:
            close_batch(batch)
    return batch


def add_to_batch(batch: Batch | int, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[Job]:
    """Enqueue more members of an open batch; InvalidJob (nothing written) if it is
    closed."""
    batch_id = batch.pk if isinstance(batch, Batch) else int(batch)
    using = router.db_for_write(Job)
    with transaction.atomic(using=using):
        created = enqueue_many(list(jobs))
        if not batches.add_members(Job, using, batch_id, [job.id for job in created]):
            raise InvalidJob(f"batch #{batch_id} is closed (or does not exist).")
    for job in created:
        job.batch_id, job.workflow = batch_id, True
    if isinstance(batch, Batch):
        batch.refresh_from_db()
    return created


def close_batch(batch: Batch | int) -> None:
    """No more members: the callbacks run once every member has ended (at once if all
    have)."""
    batch_id = batch.pk if isinstance(batch, Batch) else int(batch)
    if not batches.close(router.db_for_write(Job), batch_id):
        raise InvalidJob(f"batch #{batch_id} does not exist.")
    if isinstance(batch, Batch):
        batch.closed = True


def callback_fields(spec: Any) -> dict[str, Any]:
    """A callback (a task, or a dict like an enqueue_many item) validated, as the Job
    fields the batch keeps. Its task must take the keyword argument ``batch``."""
    if isinstance(spec, Mapping):
        spec = dict(spec)
        task = spec.pop("task", None)
        args, kwargs = spec.pop("args", None), dict(spec.pop("kwargs", None) or {})
        options = spec
    else:
        task, args, kwargs, options = spec, None, {}, {}
    if task is None:
        raise InvalidJob("a batch callback needs a 'task'.")
    for name in _NOT_FOR_CALLBACKS:
        if options.get(name) is not None:
            raise InvalidJob(f"a batch callback does not take {name}.")
    if "batch" in kwargs:
        raise InvalidJob("a batch callback's 'batch' argument is given by the batch.")
    job = build_job(task, args, {**kwargs, "batch": {}}, **options)
    _takes_batch(job.task)
    fields = {name: getattr(job, name) for name in CALLBACK_FIELDS}
    fields["kwargs"] = kwargs
    return fields


def _takes_batch(path: str) -> None:
    """The callback's function takes the keyword argument ``batch`` (checked where its
    signature can be read: a plain ``@job`` function)."""
    func = registry.find(path).func
    func = getattr(func, "func", func)  # a Django Task wraps its function
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return
    kinds = {p.kind for p in parameters}
    names = {p.name for p in parameters if p.kind != p.POSITIONAL_ONLY}
    if "batch" not in names and inspect.Parameter.VAR_KEYWORD not in kinds:
        raise InvalidJob(f"a batch callback must take the keyword argument 'batch': {path}.")
