"""The Django Tasks framework: ``django.tasks`` on Django 6+, else the ``django-tasks`` backport.

Everything the app needs from the framework is imported here and nowhere else, so the
two spellings (the backport names a few exceptions differently) meet in one place.
Type checking follows ``django.tasks`` (django-stubs), the API the backport mirrors.
"""

from __future__ import annotations

from importlib.util import find_spec
from types import GenericAlias
from typing import TYPE_CHECKING

if TYPE_CHECKING or find_spec("django.tasks") is not None:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK_MODULE = "django.tasks"
elif find_spec("django_tasks") is None:
    raise ImportError(
        "DBQueueBackend needs the Django Tasks framework: Django 6+ (django.tasks) or, on "
        'Django 5.2, the django-tasks backport (django-dbqueue\'s "tasks" extra) with '
        "'django_tasks' in INSTALLED_APPS."
    )
else:  # Django 5.2 with the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK_MODULE = "django_tasks"

if TYPE_CHECKING:
    GenericTask = Task
else:

    class _GenericTask:
        """``GenericTask[P, T]`` as a base class: ``Task`` is generic only in the type
        stubs (on Django 6), so subscripting it at run time needs this alias."""

        def __getitem__(self, params: object) -> object:
            return GenericAlias(Task, params)

    GenericTask = _GenericTask()

__all__ = [
    "FRAMEWORK_MODULE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "GenericTask",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
