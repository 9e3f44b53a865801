"""chain() and group(): sugar over ``depends_on`` (docs/workflows.md).

A step is a task or a dict like an ``enqueue_many`` item (``{"task": ..., "args": [...],
...options}``). A chain's step waits for the step before it (and reads its result with
:func:`~django_dbqueue.workflows.results.previous_result`); a group's members run in
parallel, each waiting for what the group was given to wait for. Everything is enqueued
in one transaction, as ``enqueue_many()`` with ``item(index)`` dependencies: a bad
step writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django_dbqueue.bulk import enqueue_many
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.workflows.graph import item


def chain(
    *steps: Any, depends_on: Sequence[Any] = (), on_dependency_failure: str = "cancel"
) -> list[Job]:
    """Enqueue ``steps`` one after the other: each waits for the one before (the first
    for ``depends_on``). A step that fails cancels the rest (or, with
    ``on_dependency_failure="run"``, they run anyway). Returns the jobs, in order."""
    if not steps:
        raise InvalidJob("a chain needs at least one step.")
    before = [list(depends_on)] + [[item(index)] for index in range(len(steps) - 1)]
    pairs = zip(steps, before, strict=True)
    return enqueue_many([_item(step, after, on_dependency_failure) for step, after in pairs])


def group(
    *members: Any, depends_on: Sequence[Any] = (), on_dependency_failure: str = "cancel"
) -> list[Job]:
    """Enqueue ``members`` to run in parallel, each after ``depends_on``; a chain step
    that waits for the whole group takes the returned list as its ``depends_on``."""
    if not members:
        raise InvalidJob("a group needs at least one member.")
    return enqueue_many([_item(m, list(depends_on), on_dependency_failure) for m in members])


def _item(step: Any, before: list[Any], rule: str) -> dict[str, Any]:
    """A step as an enqueue_many() item that waits for ``before``."""
    if isinstance(step, Mapping):
        options = dict(step)
        if "task" not in options:
            raise InvalidJob("every step needs a 'task'.")
        if options.get("depends_on") is not None:
            raise InvalidJob("a step's dependencies are given by its chain or group.")
    else:
        options = {"task": step}
    options["on_dependency_failure"] = options.get("on_dependency_failure") or rule
    options["depends_on"] = before or None
    return options
