"""The Task a job was enqueued for: its options kept on the Job, and the Task rebuilt from them.

``TaskResult.task`` is "the Task the result was enqueued for", so ``get_result(id).task``
must equal the enqueued Task, option for option. The Job's columns keep ``priority``,
``queue_name`` and ``backend`` as given. The rest is not safe in a column: ``run_after``
moves with retries, ``max_attempts`` is resolved to the setting's default, ``unique_key``
is cleared when the job finishes, and newer Django versions add options. Those are kept
in ``Job.task_options``, and only where they differ from the task's declaration, so a
task enqueued as declared stores nothing.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_dbqueue.tasks.compat import InvalidTask, InvalidTaskBackend

if TYPE_CHECKING:
    from django_dbqueue.models import Job
    from django_dbqueue.tasks.compat import Task

# Task fields the Job's columns hold exactly (func is the Job's task path).
IN_COLUMNS = frozenset({"func", "priority", "queue_name", "backend"})
_DATETIME = "__datetime__"
_MISSING = object()


def options_to_store(task: Task[..., Any], declared: Task[..., Any]) -> dict[str, Any] | None:
    """The options of ``task`` that differ from ``declared``, as JSON; None when none do.

    Raises InvalidTask for an option whose value JSON cannot hold (a Task subclass's own
    field, say): the Task could not be given back as it was enqueued.
    """
    stored: dict[str, Any] = {}
    for field in dataclasses.fields(task):
        if field.name in IN_COLUMNS:
            continue
        value = getattr(task, field.name)
        if value != getattr(declared, field.name, _MISSING):
            stored[field.name] = _encode(task, field.name, value)
    return stored or None


def stored_options(job: Job) -> dict[str, Any]:
    """The options :func:`options_to_store` kept on ``job``, decoded."""
    return {name: _decode(value) for name, value in (job.task_options or {}).items()}


def rebuild(declared: Task[..., Any], changes: dict[str, Any]) -> Task[..., Any]:
    """``declared`` with ``changes``; ``declared`` itself when nothing changes.

    The enqueued Task was valid when it was enqueued. If today's settings refuse it (its
    queue was removed since, say), it is still the Task the job was enqueued for: built
    as it was, without validating it again.
    """
    names = {field.name for field in dataclasses.fields(declared)}
    # Options of another Django version that this one's Task does not have are dropped.
    changes = {name: value for name, value in changes.items() if name in names}
    if all(getattr(declared, name) == value for name, value in changes.items()):
        return declared
    try:
        return dataclasses.replace(declared, **changes)
    except (InvalidTask, InvalidTaskBackend):
        task = object.__new__(type(declared))
        for name in names:
            object.__setattr__(task, name, changes.get(name, getattr(declared, name)))
        return task


def _encode(task: Task[..., Any], name: str, value: Any) -> Any:
    if isinstance(value, datetime):
        return {_DATETIME: value.isoformat()}
    try:
        stored = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        stored = _MISSING
    if stored != value or (isinstance(value, dict) and _DATETIME in value):
        raise InvalidTask(
            f"Task {task.module_path}: option {name}={value!r} cannot be stored as JSON, so "
            "its result could not name the Task as it was enqueued. Use plain values "
            "(str, int, float, bool, None, lists and dicts of them) for Task options."
        )
    return stored


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {_DATETIME}:
        return datetime.fromisoformat(value[_DATETIME])
    return value
