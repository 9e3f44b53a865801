"""chain() and group(): sugar over ``depends_on`` (docs/workflows.md).

A step is a task or a dict like an ``enqueue_many`` item (``{"task": ..., "args": [...],
...options}``). A chain's step waits for the step before it (and reads its result with
:func:`~django_dbqueue.workflows.results.previous_result`); a group's members run in
parallel, each waiting for what the group was given to wait for. Everything is enqueued
in one transaction: a bad step writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import router, transaction

from django_dbqueue.enqueueing import enqueue
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job


def chain(
    *steps: Any, depends_on: Sequence[Any] = (), on_dependency_failure: str = "cancel"
) -> list[Job]:
    """Enqueue ``steps`` one after the other: each waits for the one before (the first
    for ``depends_on``). A step that fails cancels the rest (or, with
    ``on_dependency_failure="run"``, they run anyway). Returns the jobs, in order."""
    if not steps:
        raise InvalidJob("a chain needs at least one step.")
    jobs: list[Job] = []
    with transaction.atomic(using=router.db_for_write(Job)):
        before: list[Any] = list(depends_on)
        for step in steps:
            made = _enqueue(step, before, on_dependency_failure)
            jobs.append(made)
            before = [made]
    return jobs


def group(
    *members: Any, depends_on: Sequence[Any] = (), on_dependency_failure: str = "cancel"
) -> list[Job]:
    """Enqueue ``members`` to run in parallel, each after ``depends_on``; a chain step
    that waits for the whole group takes the returned list as its ``depends_on``."""
    if not members:
        raise InvalidJob("a group needs at least one member.")
    with transaction.atomic(using=router.db_for_write(Job)):
        return [_enqueue(m, list(depends_on), on_dependency_failure) for m in members]


def _enqueue(step: Any, before: list[Any], rule: str) -> Job:
    if isinstance(step, Mapping):
        options = dict(step)
        task = options.pop("task", None)
        if task is None:
            raise InvalidJob("every step needs a 'task'.")
        args, kwargs = options.pop("args", None), options.pop("kwargs", None)
        if options.get("depends_on") is not None:
            raise InvalidJob("a step's dependencies are given by its chain or group.")
    else:
        task, args, kwargs, options = step, None, None, {}
    options["on_dependency_failure"] = options.get("on_dependency_failure") or rule
    return enqueue(task, args, kwargs, depends_on=before or None, **options)
