"""enqueue() and enqueue_many(): validate everything first, then write."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from django.db import IntegrityError, OperationalError, connections, router, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from django_dbqueue import bounds, signals
from django_dbqueue.conf import PerSettings, settings
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments
from django_dbqueue.models import Job
from django_dbqueue.queue.dialects import is_deadlock
from django_dbqueue.queue.insert import JSON_TEXT, insert_one, json_text
from django_dbqueue.queue.keys import ensure_keys
from django_dbqueue.registry import path_for_enqueue
from django_dbqueue.worker import wakeup


@dataclass
class JobSpec:
    """One job of an :func:`enqueue_many` call."""

    task: Any
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


class Defaults(NamedTuple):
    """The settings enqueue needs, read once per settings object rather than per job."""

    queues: frozenset[str]
    queue: str
    priority: int
    max_attempts: int
    validate_tasks: bool
    max_payload_bytes: int

    @classmethod
    def read(cls) -> Defaults:
        return _current_defaults()


def _read_defaults() -> Defaults:
    return Defaults(
        frozenset(settings.QUEUES),
        settings.DEFAULT_QUEUE,
        settings.DEFAULT_PRIORITY,
        settings.MAX_ATTEMPTS,
        bool(settings.VALIDATE_TASKS),
        int(settings.MAX_PAYLOAD_BYTES),
    )


_current_defaults = PerSettings(_read_defaults)


# Field defaults: constants are copied into each job; callables (timezone.now, list,
# dict) are called for each job that does not set the field.
_CONSTANT_DEFAULTS = {
    f.attname: f.get_default()
    for f in Job._meta.concrete_fields
    if not (f.has_default() and callable(f.default))
}
_CALLABLE_DEFAULTS = [
    (f.attname, f.get_default)
    for f in Job._meta.concrete_fields
    if f.has_default() and callable(f.default)
]
TASK_PATH_MAX = Job._meta.get_field("task").max_length or 255


def new_job(values: dict[str, Any]) -> Job:
    """An unsaved Job from field values (unvalidated: for code that built them itself).

    Built as ``Model.from_db`` builds rows, without ``Model.__init__``'s keyword handling
    (most of the cost of a job object): the attributes are set directly.
    """
    job = Job.__new__(Job)
    attrs = job.__dict__
    attrs.update(_CONSTANT_DEFAULTS)
    for name, default in _CALLABLE_DEFAULTS:
        if name not in values:
            attrs[name] = default()
    attrs.update(values)
    job._state = ModelState()
    return job


def _check_json(value: list[Any] | dict[str, Any], what: str) -> tuple[Any, str]:
    """(the value as the job will receive it, its JSON text)."""
    if not value:
        return type(value)(), "[]" if isinstance(value, list) else "{}"
    try:
        # Round-trip so what is stored is exactly what the job will receive
        # (tuples become lists) and NaN/Infinity, which JSON lacks, are refused.
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise bounds.too_deep(what) from None
    except (TypeError, ValueError) as exc:
        raise InvalidJobArguments(
            f"Job {what} must be JSON-serializable (str, int, float, bool, None, list, dict): "
            f"{exc}. Pass ids or plain data instead of objects."
        ) from None
    # Nesting cannot be deeper than the brackets in the text: most arguments need no walk.
    if text.count("[") + text.count("{") > bounds.MAX_NESTING + 1:
        bounds.check_nesting(value, what)
    if bounds.has_nul(text):
        raise InvalidJob(
            f"Job {what} contain a NUL character (\\x00), which PostgreSQL cannot store in "
            "JSON; encode binary data (e.g. base64) before enqueueing it."
        )
    items = value.values() if isinstance(value, dict) else value
    if all(type(item) in _PLAIN for item in items):
        # Flat plain values: the round trip would give back equal values (NaN and
        # infinities were refused above); ``value`` is the caller's copy already.
        return value, text
    return json.loads(text), text


# Exact types (not subclasses such as enums, which JSON turns into plain values).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _run_after(run_after: datetime | timedelta | float | int | None, now: datetime) -> datetime:
    if run_after is None:
        return now
    if isinstance(run_after, timedelta):
        bounds.check_delay(run_after.total_seconds(), repr(run_after))
        return now + run_after
    if isinstance(run_after, datetime):
        if timezone.is_naive(run_after):
            raise InvalidJob("run_after must be timezone-aware (use django.utils.timezone.now()).")
        try:
            offset = (run_after - now).total_seconds()
        except OverflowError:
            offset = bounds.MAX_RUN_AFTER * 2
        bounds.check_delay(offset, run_after.isoformat())
        return run_after
    if isinstance(run_after, int | float) and not isinstance(run_after, bool):
        delay = bounds.check_delay(bounds.seconds(run_after, "run_after"), repr(run_after))
        return now + timedelta(seconds=delay)
    raise InvalidJob(f"run_after must be a datetime, timedelta or seconds, not {run_after!r}.")


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
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    backend: str = "",
    now: datetime | None = None,
    defaults: Defaults | None = None,
    check_task: bool = True,
) -> Job:
    """Validate one job and return it unsaved. Raises InvalidJob on any bad input.

    ``defaults`` lets a caller building many jobs read the settings once. Options left
    at None take the task's ``@job`` defaults, then the ``DBQUEUE`` ones. With
    ``check_task`` off, ``task`` is a path the caller has checked itself.
    """
    now = now or timezone.now()
    defaults = defaults or Defaults.read()
    if check_task:
        path, task_defaults = path_for_enqueue(task, defaults.validate_tasks)
    else:
        path, task_defaults = str(task), {}
    if len(path) > TASK_PATH_MAX:
        raise InvalidJob(f"a task path is at most {TASK_PATH_MAX} characters long.")
    if task_defaults:
        queue = task_defaults.get("queue") if queue is None else queue
        priority = task_defaults.get("priority") if priority is None else priority
        max_attempts = task_defaults.get("max_attempts") if max_attempts is None else max_attempts
        timeout = task_defaults.get("timeout") if timeout is None else timeout
        retry_backoff = (
            task_defaults.get("retry_backoff") if retry_backoff is None else retry_backoff
        )
    if args is None:
        args = []
    concurrency_key, concurrency_limit = _concurrency(
        task_defaults, concurrency_key, concurrency_limit, args, kwargs
    )
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise InvalidJob(f"args must be a list or tuple, not {type(args).__name__}.")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidJob("kwargs must be a dict with string keys.")
    queue = bounds.check_queue_name(defaults.queue if queue is None else queue)
    if queue not in defaults.queues:
        raise InvalidJob(
            f"Unknown queue {queue!r}. Known queues: {', '.join(sorted(defaults.queues))}. "
            "Add it to DBQUEUE['QUEUES'] in your settings."
        )
    priority = bounds.check_priority(defaults.priority if priority is None else priority)
    max_attempts = bounds.check_max_attempts(
        defaults.max_attempts if max_attempts is None else max_attempts
    )
    if unique_key is not None and (
        not isinstance(unique_key, str) or not 0 < len(unique_key) <= 255
    ):
        raise InvalidJob("unique_key must be a string of 1 to 255 characters.")
    job_args, args_text = _check_json(list(args), "args")
    job_kwargs, kwargs_text = _check_json(dict(kwargs), "kwargs")
    size = len(args_text) + len(kwargs_text)
    if size > defaults.max_payload_bytes:
        raise InvalidJob(
            f"Job args and kwargs take {size} bytes as JSON, more than "
            f"DBQUEUE['MAX_PAYLOAD_BYTES'] ({defaults.max_payload_bytes}). Store big data "
            "elsewhere (a model, a file) and pass its id."
        )
    job = new_job(
        {
            "task": path,
            "args": job_args,
            "kwargs": job_kwargs,
            "queue": queue,
            "priority": priority,
            "run_after": _run_after(run_after, now),
            "max_attempts": max_attempts,
            "timeout": bounds.check_timeout(timeout),
            "retry_backoff": bounds.check_retry_backoff(retry_backoff),
            "unique_key": unique_key,
            "origin_unique_key": unique_key,
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
            "backend": backend,
            "created_at": now,
            "errors": [],
        }
    )
    # The INSERT binds the text that was checked rather than serializing them again.
    job.__dict__[JSON_TEXT] = {"args": (job_args, args_text), "kwargs": (job_kwargs, kwargs_text)}
    return job


def format_concurrency_key(template: str, args: Any, kwargs: Any) -> str:
    """A ``@job``/``@task`` concurrency_key template formatted with a call's arguments."""
    try:
        return template.format(*(args or ()), **(kwargs or {}))
    except (IndexError, KeyError, ValueError, AttributeError) as exc:
        raise InvalidJob(
            f"concurrency_key {template!r} cannot be formatted with this job's arguments: {exc!r}."
        ) from None


def _concurrency(
    task_defaults: Mapping[str, Any],
    key: str | None,
    limit: int | None,
    args: Any,
    kwargs: Any,
) -> tuple[str | None, int | None]:
    """(concurrency_key, concurrency_limit): the given ones, else the task's defaults,
    whose key is a format string over the job's arguments."""
    if key is None and task_defaults.get("concurrency_key") is not None:
        key = format_concurrency_key(str(task_defaults["concurrency_key"]), args, kwargs)
    if limit is None:
        limit = task_defaults.get("concurrency_limit")
    if key is None:
        if limit is not None:
            raise InvalidJob("concurrency_limit needs a concurrency_key.")
        return None, None
    return bounds.check_concurrency_key(key), bounds.check_concurrency_limit(
        1 if limit is None else limit
    )


def enqueue(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Job:
    """Add a job; it becomes visible to workers when the surrounding transaction commits.

    ``task`` is a registered task (an ``@job`` function or a Django ``@task``) or its
    dotted path; anything else raises InvalidJob. Options: queue, priority,
    run_after (datetime, timedelta or seconds), max_attempts, timeout, retry_backoff,
    unique_key, concurrency_key and concurrency_limit (default 1; docs/concurrency.md).
    With ``unique_key`` set and a job of that key still waiting or running,
    that job is returned instead of a new one. A misspelt option is a TypeError.
    """
    if options:
        bounds.unknown_options("enqueue()", options)
    job, _created = save_job(build_job(task, args, kwargs, **options))
    return job


def save_job(job: Job) -> tuple[Job, bool]:
    """Insert a job built by :func:`build_job`; returns (job, created).

    With a ``unique_key`` that a waiting or running job holds, nothing is inserted and
    that job is returned with ``created=False``. A created job's ``jobs_enqueued`` is
    sent when the surrounding transaction commits.
    """
    using = router.db_for_write(Job)
    if job.concurrency_key is not None:
        ensure_keys(using, [job.concurrency_key])
    saved, created = _insert(job, using)
    if created:
        transaction.on_commit(partial(_committed, [saved], using), using=using)
    return saved, created


def _committed(jobs: list[Job], using: str) -> None:
    """On commit: wake the workers, then tell ``jobs_enqueued``'s receivers."""
    wakeup.jobs_committed(jobs, using)
    signals.jobs_enqueued.send(Job, jobs=jobs)


def _insert(job: Job, using: str) -> tuple[Job, bool]:
    """One INSERT statement, in the caller's transaction or (outside one) autocommitted
    by itself: no savepoint, no BEGIN/COMMIT of its own. On PostgreSQL the same
    statement makes the wake-up's pg_notify (sent on commit)."""
    conn = connections[using]
    values = job.__dict__
    text = json_text(job)
    unique = job.unique_key is not None
    due = job.run_after <= timezone.now()
    notify = wakeup.notify_args(conn, job.queue) if due else None
    notified_at = time.monotonic()  # before the INSERT that carries the pg_notify
    # Outside a caller's transaction a deadlock between inserts of the same key (InnoDB
    # locks the duplicate's index record) can be retried: nothing else was rolled back.
    # Inside one it cannot: InnoDB rolled back the caller's whole transaction.
    retry_deadlocks = unique and not conn.in_atomic_block
    for _ in range(5):
        try:
            with transaction.mark_for_rollback_on_error(using):
                try:
                    new_id = insert_one(Job, conn, values, text, unique, notify)
                except IntegrityError:
                    # MySQL/MariaDB: the key is taken. The error rolled back this
                    # statement only, so the caller's transaction goes on.
                    if not unique or conn.vendor != "mysql":
                        raise
                    new_id = None
        except OperationalError as exc:
            if not (retry_deadlocks and is_deadlock(exc)):
                raise
            continue
        if new_id is not None:
            job.id = new_id
            job._state.adding = False
            job._state.db = using
            values.pop(JSON_TEXT, None)
            if notify is not None:
                values[wakeup.WOKEN] = notified_at
            return job, True
        existing = Job.objects.using(using).filter(unique_key=job.unique_key).first()
        if existing is not None:
            return existing, False
        # The holder of the key finished between our insert and our read: try again.
    raise InvalidJob(
        f"Could not enqueue unique job {job.unique_key!r}: the key kept changing hands."
    )


def enqueue_many(jobs: Iterable[JobSpec | Mapping[str, Any]], batch_size: int = 1000) -> list[Job]:
    """Validate every job, then insert them all in batches in one transaction.

    Each item is a :class:`JobSpec` or a dict with the keys of :func:`enqueue`.
    Nothing is written if any item is invalid. ``unique_key`` is refused: one
    multi-row INSERT cannot skip the rows whose key is taken (MariaDB's INSERT IGNORE
    would also swallow every other error), so use :func:`enqueue` for unique jobs.
    """
    now = timezone.now()
    defaults = Defaults.read()
    built: list[Job] = []
    for index, item in enumerate(jobs):
        spec = item if isinstance(item, JobSpec) else _spec_from_mapping(item)
        if spec.options:
            try:
                bounds.unknown_options("enqueue_many()", spec.options)
            except TypeError as exc:
                raise TypeError(f"job {index}: {exc}") from None
        if spec.options.get("unique_key") is not None:
            raise InvalidJob(
                "enqueue_many() does not take unique_key: its multi-row INSERT is one "
                "statement, so one taken key would fail the whole batch; use enqueue() "
                "for unique jobs."
            )
        try:
            built.append(
                build_job(
                    spec.task,
                    spec.args,
                    spec.kwargs,
                    now=now,
                    defaults=defaults,
                    **spec.options,
                )
            )
        except InvalidJob as exc:
            raise InvalidJob(f"job {index}: {exc}") from None
    if not built:
        return []
    using = router.db_for_write(Job)
    with transaction.atomic(using=using):
        keys = [job.concurrency_key for job in built if job.concurrency_key is not None]
        if keys:
            ensure_keys(using, keys)
        created = Job.objects.db_manager(using).insert_many(built, batch_size=batch_size)
    transaction.on_commit(partial(_committed, created, using), using=using)
    return created


def _spec_from_mapping(item: Mapping[str, Any]) -> JobSpec:
    options = dict(item)
    try:
        task = options.pop("task")
    except KeyError:
        raise InvalidJob("every job needs a 'task'.") from None
    return JobSpec(task, options.pop("args", ()) or (), options.pop("kwargs", {}) or {}, options)
