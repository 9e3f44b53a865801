"""enqueue() and enqueue_many(): validate everything first, then write."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import IntegrityError, router, transaction
from django.utils import timezone

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments
from django_dbqueue.models import Job
from django_dbqueue.registry import resolve, task_path

QUEUE_NAME_MAX = Job._meta.get_field("queue").max_length or 64
PRIORITY_RANGE = (-32768, 32767)


@dataclass
class JobSpec:
    """One job of an :func:`enqueue_many` call."""

    task: Any
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


class Defaults(NamedTuple):
    """The settings enqueue needs, read once per call rather than once per job."""

    queues: frozenset[str]
    queue: str
    priority: int
    max_attempts: int
    validate_tasks: bool

    @classmethod
    def read(cls) -> Defaults:
        return cls(
            frozenset(settings.QUEUES),
            settings.DEFAULT_QUEUE,
            settings.DEFAULT_PRIORITY,
            settings.MAX_ATTEMPTS,
            bool(settings.VALIDATE_TASKS),
        )


# Job(*values) in field order skips the keyword handling of Model.__init__, which is most
# of the cost of building a job in enqueue_many().
_FIELDS = [f.attname for f in Job._meta.concrete_fields]
_DEFAULTS = {f.attname: f.get_default() for f in Job._meta.concrete_fields}


def new_job(values: dict[str, Any]) -> Job:
    """An unsaved Job from field values (unvalidated: for code that built them itself)."""
    model: Any = Job  # positional construction is beyond what the type stubs describe
    return model(*[values[name] if name in values else _DEFAULTS[name] for name in _FIELDS])  # type: ignore[no-any-return]


def _check_json(value: Any, what: str) -> Any:
    if not value and isinstance(value, list | dict):
        return type(value)()
    try:
        # Round-trip so what is stored is exactly what the job will receive
        # (tuples become lists) and NaN/Infinity, which JSON lacks, are refused.
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidJobArguments(
            f"Job {what} must be JSON-serializable (str, int, float, bool, None, list, dict): "
            f"{exc}. Pass ids or plain data instead of objects."
        ) from None


def _run_after(run_after: datetime | timedelta | float | int | None, now: datetime) -> datetime:
    if run_after is None:
        return now
    if isinstance(run_after, timedelta):
        return now + run_after
    if isinstance(run_after, datetime):
        if timezone.is_naive(run_after):
            raise InvalidJob("run_after must be timezone-aware (use django.utils.timezone.now()).")
        return run_after
    if isinstance(run_after, int | float) and not isinstance(run_after, bool):
        return now + timedelta(seconds=run_after)
    raise InvalidJob(f"run_after must be a datetime, timedelta or seconds, not {run_after!r}.")


def _positive(value: Any, name: str, allow_none: bool = True) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidJob(f"{name} must be a positive number, not {value!r}.")
    return value


def build_job(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_after: datetime | timedelta | float | int | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    retry_backoff: float | None = None,
    unique_key: str | None = None,
    backend: str = "",
    now: datetime | None = None,
    defaults: Defaults | None = None,
    checked_paths: set[str] | None = None,
) -> Job:
    """Validate one job and return it unsaved. Raises InvalidJob on any bad input.

    ``defaults`` and ``checked_paths`` let a caller building many jobs read the settings
    and import each task path once.
    """
    now = now or timezone.now()
    defaults = defaults or Defaults.read()
    path = task_path(task)
    if defaults.validate_tasks and isinstance(task, str):
        if checked_paths is None or path not in checked_paths:
            resolve(path)
            if checked_paths is not None:
                checked_paths.add(path)
    if args is None:
        args = []
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise InvalidJob(f"args must be a list or tuple, not {type(args).__name__}.")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidJob("kwargs must be a dict with string keys.")
    queue = defaults.queue if queue is None else queue
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidJob("queue must be a non-empty string.")
    if len(queue) > QUEUE_NAME_MAX:
        raise InvalidJob(
            f"queue name {queue[:20]!r}... is longer than {QUEUE_NAME_MAX} characters."
        )
    if queue not in defaults.queues:
        raise InvalidJob(
            f"Unknown queue {queue!r}. Known queues: {', '.join(sorted(defaults.queues))}. "
            "Add it to DBQUEUE['QUEUES'] in your settings."
        )
    priority = defaults.priority if priority is None else priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidJob(f"priority must be an integer, not {priority!r}.")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise InvalidJob(f"priority must be between {PRIORITY_RANGE[0]} and {PRIORITY_RANGE[1]}.")
    if max_attempts is None:
        max_attempts = defaults.max_attempts
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidJob(f"max_attempts must be an integer of at least 1, not {max_attempts!r}.")
    if unique_key is not None and (
        not isinstance(unique_key, str) or not 0 < len(unique_key) <= 255
    ):
        raise InvalidJob("unique_key must be a string of 1 to 255 characters.")
    return new_job(
        {
            "task": path,
            "args": _check_json(list(args), "args"),
            "kwargs": _check_json(dict(kwargs), "kwargs"),
            "queue": queue,
            "priority": priority,
            "run_after": _run_after(run_after, now),
            "max_attempts": max_attempts,
            "timeout": _positive(timeout, "timeout"),
            "retry_backoff": None if retry_backoff is None else _non_negative(retry_backoff),
            "unique_key": unique_key,
            "backend": backend,
            "created_at": now,
            "errors": [],
        }
    )


def _non_negative(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidJob(f"retry_backoff must be a number of seconds >= 0, not {value!r}.")
    return float(value)


def enqueue(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Job:
    """Add a job; it becomes visible to workers when the surrounding transaction commits.

    ``task`` is a module-level callable or its dotted path. Options: queue, priority,
    run_after (datetime, timedelta or seconds), max_attempts, timeout, retry_backoff,
    unique_key. With ``unique_key`` set and a job of that key still waiting or running,
    that job is returned instead of a new one.
    """
    job, _created = save_job(build_job(task, args, kwargs, **options))
    return job


def save_job(job: Job) -> tuple[Job, bool]:
    """Insert a job built by :func:`build_job`; returns (job, created).

    With a ``unique_key`` that a waiting or running job holds, nothing is inserted and
    that job is returned with ``created=False``. A created job's ``jobs_enqueued`` is
    sent when the surrounding transaction commits.
    """
    using = router.db_for_write(Job)
    saved, created = _insert(job, using)
    if created:
        transaction.on_commit(lambda: signals.jobs_enqueued.send(Job, jobs=[saved]), using=using)
    return saved, created


def _insert(job: Job, using: str) -> tuple[Job, bool]:
    if job.unique_key is None:
        job.save(using=using, force_insert=True)
        return job, True
    for _ in range(3):
        try:
            with transaction.atomic(using=using):
                job.save(using=using, force_insert=True)
            return job, True
        except IntegrityError:
            existing = Job.objects.using(using).filter(unique_key=job.unique_key).first()
            if existing is not None:
                return existing, False
            # The holder of the key finished between our insert and our read: try again.
            job.pk = None
    raise InvalidJob(
        f"Could not enqueue unique job {job.unique_key!r}: the key kept changing hands."
    )


def enqueue_many(jobs: Iterable[JobSpec | Mapping[str, Any]], batch_size: int = 1000) -> list[Job]:
    """Validate every job, then insert them all in batches in one transaction.

    Each item is a :class:`JobSpec` or a dict with the keys of :func:`enqueue`.
    Nothing is written if any item is invalid. unique_key is not supported here.
    """
    now = timezone.now()
    defaults = Defaults.read()
    checked: set[str] = set()
    built: list[Job] = []
    for index, item in enumerate(jobs):
        spec = item if isinstance(item, JobSpec) else _spec_from_mapping(item)
        if spec.options.get("unique_key") is not None:
            raise InvalidJob("enqueue_many() does not take unique_key; use enqueue() for those.")
        try:
            built.append(
                build_job(
                    spec.task,
                    spec.args,
                    spec.kwargs,
                    now=now,
                    defaults=defaults,
                    checked_paths=checked,
                    **spec.options,
                )
            )
        except InvalidJob as exc:
            raise InvalidJob(f"job {index}: {exc}") from None
    if not built:
        return []
    using = router.db_for_write(Job)
    with transaction.atomic(using=using):
        created = Job.objects.db_manager(using).insert_many(built, batch_size=batch_size)
    transaction.on_commit(lambda: signals.jobs_enqueued.send(Job, jobs=created), using=using)
    return created


def _spec_from_mapping(item: Mapping[str, Any]) -> JobSpec:
    options = dict(item)
    try:
        task = options.pop("task")
    except KeyError:
        raise InvalidJob("every job needs a 'task'.") from None
    return JobSpec(task, options.pop("args", ()) or (), options.pop("kwargs", {}) or {}, options)
