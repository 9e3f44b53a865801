"""Django Tasks backend: ``@task`` functions run through the Job table and ``run_jobs``.

``TASKS = {"default": {"BACKEND": "django_dbqueue.backends.DBQueueBackend"}}``
(a re-export of this module's class).
Works with ``django.tasks`` (Django 6+) and the ``django-tasks`` backport (Django 5.2);
see :mod:`django_dbqueue.tasks.compat`. Models are imported inside methods: backends are
created when the first ``@task`` is declared, which may be before the app registry is
ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from django.apps import apps
from django.core import checks
from django.db import router, transaction
from django.utils import timezone

from django_dbqueue.arguments import format_concurrency_key
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments, TaskNotFound
from django_dbqueue.options import TASK_FIELDS
from django_dbqueue.registry import registered
from django_dbqueue.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_enqueued,
)
from django_dbqueue.tasks.results import task_result_from_job
from django_dbqueue.tasks.task import DBQueueTask

if TYPE_CHECKING:
    from django_dbqueue.models import Job

P = ParamSpec("P")
T = TypeVar("T")

__all__ = ["DBQueueBackend", "DBQueueTask"]


class DBQueueBackend(BaseTaskBackend):
    """Stores each enqueued Task as a :class:`~django_dbqueue.models.Job` row.

    Queues: ``DBQUEUE['QUEUES']`` decides which queues exist (workers run only those).
    A ``QUEUES`` list in this backend's ``TASKS`` entry is optional and narrows what
    tasks of this backend may use; without it every ``DBQUEUE`` queue is allowed.
    """

    task_class = DBQueueTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.explicit_queues = "QUEUES" in params
        if not self.explicit_queues:
            # The framework's default would be {"default"}; ours is DBQUEUE['QUEUES'],
            # read at validation time so override_settings applies.
            self.queues = set()

    # -- validation ------------------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        self._validate_for_framework(task)
        try:
            # The same checks enqueue() makes, without writing anything.
            self._build_job(task, [], {}, declaring=True)
        except InvalidJob as exc:
            raise InvalidTask(f"Task {task.module_path}: {exc}") from None

    def _validate_for_framework(self, task: Task[..., Any]) -> None:
        if self.explicit_queues and task.queue_name not in self.queues:
            raise InvalidTask(
                f"Queue {task.queue_name!r} is not in TASKS[{self.alias!r}]['QUEUES'] "
                f"({', '.join(sorted(self.queues))}). Add it there (and to DBQUEUE['QUEUES']), "
                "or remove QUEUES from the TASKS entry to allow every DBQUEUE queue."
            )
        super().validate_task(task)

    def _build_job(
        self, task: Task[..., Any], args: Sequence[Any], kwargs: Any, declaring: bool = False
    ) -> Job:
        """The Job for ``task`` called with ``args``/``kwargs``, unsaved. ``declaring``:
        no call yet, so a concurrency_key template is checked as it is, not formatted."""
        from django_dbqueue.enqueueing import build_job

        # Every option the Task carries (a framework Task only the framework's own).
        options = {name: getattr(task, field, None) for name, field in TASK_FIELDS.items()}
        # The framework allows any whole number (5.0 included); the column is an integer.
        options["priority"] = int(task.priority)
        key = options.get("concurrency_key")
        if key is not None and not declaring:
            options["concurrency_key"] = format_concurrency_key(key, args, kwargs)
        # By path, unchecked: validate_task() runs while the task's module is still being
        # imported, before the Task is in it; enqueue() checks it with _declared().
        # Declaring (at import time) writes nothing: no read of the database's clock.
        now = timezone.now() if declaring else None
        return build_job(
            task.module_path, args, kwargs, backend=self.alias, now=now, check_task=False, **options
        )

    def _declared(self, task: Task[..., Any]) -> Task[..., Any]:
        """The Task that workers will find under ``task``'s module path."""
        # Workers find the task in their registry by its module path: that name must be
        # this Task (a function decorated under another name would not be a task there).
        entry = registered(task.module_path)
        target = entry.func if entry is not None else None
        if not isinstance(target, Task) or target.func is not task.func:
            raise InvalidTask(
                f"Workers import tasks by module path, and {task.module_path} is not this "
                "task there. Apply @task to a module-level function and keep its name: "
                "def send_mail(...) decorated with @task, not send = task(send_mail)."
            )
        return target

    # -- enqueue and results ----------------------------------------------------------

    def enqueue(
        self, task: Task[P, T], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> TaskResult[P, T]:
        """Insert the job; the task is visible to workers once the transaction commits.

        An invalid task raises the framework's ``InvalidTask`` (``InvalidTaskError`` on
        the backport), whatever setting refuses it; arguments that are not JSON raise
        :class:`~django_dbqueue.exceptions.InvalidJobArguments`, a ``TypeError`` as the
        framework documents. ``task_enqueued`` is sent on commit too, and not at all for
        a ``unique_key`` that is already taken (the existing job's result is returned).
        """
        from django_dbqueue.enqueueing import save_job
        from django_dbqueue.models import Job
        from django_dbqueue.tasks.options import options_to_store

        self._validate_for_framework(task)
        declared = self._declared(task)
        args, kwargs = _json_arguments(task, args, kwargs)
        try:
            job = self._build_job(task, args, kwargs)
        except InvalidJobArguments:
            raise
        except InvalidJob as exc:
            # Valid when declared, refused now: a settings change (a queue removed...).
            raise InvalidTask(f"Task {task.module_path}: {exc}") from None
        job.task_options = options_to_store(task, declared)
        job, created = save_job(job)
        result: TaskResult[Any, Any] = task_result_from_job(job, task if created else None)
        if created:
            sender = type(self)

            # After save_job()'s own on-commit jobs_enqueued: callbacks run in order.
            transaction.on_commit(
                lambda: task_enqueued.send(sender, task_result=result),
                using=router.db_for_write(Job),
            )
        return result

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        from django_dbqueue.models import Job

        try:
            job = Job.objects.primary().get(pk=int(result_id))
        except (TypeError, ValueError, OverflowError):
            raise TaskResultDoesNotExist(
                f"{result_id!r} is not a task result id of {type(self).__name__} (a job id)."
            ) from None
        except Job.DoesNotExist:
            raise TaskResultDoesNotExist(f"No task result (job) with id {result_id}.") from None
        try:
            return task_result_from_job(job)
        except TaskNotFound as exc:
            raise TaskResultDoesNotExist(
                f"Job {job.pk} ran the task {job.task}, which is not a registered task now, so "
                f"there is no Task to read it as ({exc}); read it with django_dbqueue.models.Job."
            ) from None

    # -- system checks ----------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("django_dbqueue"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses DBQueueBackend but django_dbqueue is not "
                    "installed.",
                    hint="Add 'django_dbqueue' to INSTALLED_APPS and run migrate.",
                    id="django_dbqueue.E201",
                )
            )
        if self.explicit_queues:
            unknown = sorted(set(self.queues) - set(settings.QUEUES))
            if unknown:
                messages.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}]['QUEUES'] lists {', '.join(unknown)}, which "
                        "DBQUEUE['QUEUES'] does not: no worker would run those tasks.",
                        hint="Add them to DBQUEUE['QUEUES'], or drop QUEUES from the TASKS "
                        "entry (every DBQUEUE queue is then allowed).",
                        id="django_dbqueue.E202",
                    )
                )
        return messages


def _json_arguments(
    task: Task[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as the framework normalizes them (tuples to lists, bytes to str)."""
    try:
        normalized = (normalize_json(list(args)), normalize_json(dict(kwargs)))
    except (TypeError, ValueError) as exc:
        raise InvalidJobArguments(
            f"Arguments of task {task.module_path} must be JSON-serializable (str, int, "
            f"float, bool, None, list, dict): {exc}. Pass ids or plain data instead of objects."
        ) from None
    return cast("tuple[list[Any], dict[str, Any]]", normalized)
