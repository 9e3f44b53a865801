"""enqueue(): validate everything first, then write one row (enqueue_many(): bulk.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple

from django.db import OperationalError, connections, router, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from django_dbqueue import bounds, signals
from django_dbqueue.conf import PerSettings, settings
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments
from django_dbqueue.models import Job
from django_dbqueue.observability import tracing
from django_dbqueue.queue import announce
from django_dbqueue.queue.concurrency import ensure_keys
from django_dbqueue.queue.dialects import is_deadlock
from django_dbqueue.queue.insert import JSON_TEXT, insert_one, json_text
from django_dbqueue.registry import path_for_enqueue


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


# json.dumps(value, allow_nan=False) without building an encoder per call (which costs
# more than encoding a short argument list): the C encoder json.dumps itself uses,
# made once. Without circular-reference markers: a list that holds itself recurses
# until RecursionError, which is refused as too deep.
_json_encoder = json.JSONEncoder(allow_nan=False)
if c_make_encoder is not None:
    _c_encode = c_make_encoder(
        None,
        _json_encoder.default,
        encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        False,
    )

    def _encode(value: Any) -> str:
        return "".join(_c_encode(value, 0))

else:  # pragma: no cover - Pythons without the C accelerator

    def _encode(value: Any) -> str:
        return _json_encoder.encode(value)


def _check_json(value: list[Any] | dict[str, Any], what: str) -> tuple[Any, str]:
    """(the value as the job will receive it, its JSON text)."""
    if not value:
        return type(value)(), "[]" if isinstance(value, list) else "{}"
    try:
        # Round-trip so what is stored is exactly what the job will receive
        # (tuples become lists) and NaN/Infinity, which JSON lacks, are refused.
        text = _encode(value)
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
    items = value.values() if type(value) is dict else value
    if _PLAIN.issuperset(map(type, items)):
        # Flat plain values: the round trip would give back equal values (NaN and
        # infinities were refused above); ``value`` is the caller's copy already.
        return value, text
    return json.loads(text), text


# Exact types (not subclasses such as enums, which JSON turns into plain values).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def run_after_time(run_after: datetime | timedelta | float | int | None, now: datetime) -> datetime:
    """When a job enqueued at ``now`` may run: ``run_after`` as a moment, a delay (a
    timedelta or seconds) or None (at once), checked against the bounds."""
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


class Shared(NamedTuple):
    """A job's task and options, validated: the same for every job of an
    :func:`enqueue_many` call that names the same task with the same options."""

    path: str
    queue: str
    priority: int
    max_attempts: int
    timeout: float | None
    retry_backoff: float | None
    key_template: str | None  # the task's concurrency_key, formatted per job
    concurrency_limit: Any  # given, else the task's; checked with a job's key
    backend: str


def check_shared(
    task: Any,
    defaults: Defaults,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    retry_backoff: float | None = None,
    concurrency_limit: int | None = None,
    backend: str = "",
    check_task: bool = True,
) -> Shared:
    """Validate what does not depend on a job's arguments. Raises InvalidJob.

    Options left at None take the task's ``@job`` defaults, then the ``DBQUEUE`` ones.
    With ``check_task`` off, ``task`` is a path the caller has checked itself.
    """
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
        if concurrency_limit is None:
            concurrency_limit = task_defaults.get("concurrency_limit")
    queue = bounds.check_queue_name(defaults.queue if queue is None else queue)
    if queue not in defaults.queues:
        raise InvalidJob(
            f"Unknown queue {queue!r}. Known queues: {', '.join(sorted(defaults.queues))}. "
            "Add it to DBQUEUE['QUEUES'] in your settings."
        )
    template = task_defaults.get("concurrency_key")
    return Shared(
        path,
        queue,
        bounds.check_priority(defaults.priority if priority is None else priority),
        bounds.check_max_attempts(defaults.max_attempts if max_attempts is None else max_attempts),
        bounds.check_timeout(timeout),
        bounds.check_retry_backoff(retry_backoff),
        None if template is None else str(template),
        concurrency_limit,
        backend,
    )


class Call(NamedTuple):
    """A job's arguments and concurrency key, validated (:func:`check_call`)."""

    args: list[Any]
    args_text: str
    kwargs: dict[str, Any]
    kwargs_text: str
    concurrency_key: str | None
    concurrency_limit: int | None


def check_call(
    shared: Shared, args: Any, kwargs: Any, concurrency_key: Any, defaults: Defaults
) -> Call:
    """Validate one job's arguments (JSON, size) and its concurrency key. Raises InvalidJob."""
    if args is None:
        args = []
    key, limit = _concurrency(shared, concurrency_key, args, kwargs)
    kind = type(args)
    job_args: list[Any]
    if (kind is list or kind is tuple) and not args:
        job_args, args_text = [], "[]"
    elif (
        kind is list
        or kind is tuple
        or (isinstance(args, Sequence) and not isinstance(args, str | bytes))
    ):
        job_args, args_text = _check_json(list(args), "args")
    else:
        raise InvalidJob(f"args must be a list or tuple, not {kind.__name__}.")
    if not kwargs:
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise InvalidJob("kwargs must be a dict with string keys.")
        job_kwargs: dict[str, Any] = {}
        kwargs_text = "{}"
    else:
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise InvalidJob("kwargs must be a dict with string keys.")
        job_kwargs, kwargs_text = _check_json(dict(kwargs), "kwargs")
    size = len(args_text) + len(kwargs_text)
    if size > defaults.max_payload_bytes:
        raise InvalidJob(
            f"Job args and kwargs take {size} bytes as JSON, more than "
            f"DBQUEUE['MAX_PAYLOAD_BYTES'] ({defaults.max_payload_bytes}). Store big data "
            "elsewhere (a model, a file) and pass its id."
        )
    return Call(job_args, args_text, job_kwargs, kwargs_text, key, limit)


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
    shared = check_shared(
        task,
        defaults,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        retry_backoff=retry_backoff,
        concurrency_limit=concurrency_limit,
        backend=backend,
        check_task=check_task,
    )
    if unique_key is not None and (
        not isinstance(unique_key, str) or not 0 < len(unique_key) <= 255
    ):
        raise InvalidJob("unique_key must be a string of 1 to 255 characters.")
    call = check_call(shared, args, kwargs, concurrency_key, defaults)
    job = new_job(
        {
            **shared_attrs(shared, now),
            "args": call.args,
            "kwargs": call.kwargs,
            "run_after": run_after_time(run_after, now),
            "unique_key": unique_key,
            "origin_unique_key": unique_key,
            "concurrency_key": call.concurrency_key,
            "concurrency_limit": call.concurrency_limit,
            "errors": [],
        }
    )
    # The INSERT binds the text that was checked rather than serializing them again.
    job.__dict__[JSON_TEXT] = {
        "args": (call.args, call.args_text),
        "kwargs": (call.kwargs, call.kwargs_text),
    }
    return job


def shared_attrs(shared: Shared, now: datetime) -> dict[str, Any]:
    """The Job attributes that :class:`Shared` decides (and ``created_at``)."""
    return {
        "task": shared.path,
        "queue": shared.queue,
        "priority": shared.priority,
        "max_attempts": shared.max_attempts,
        "timeout": shared.timeout,
        "retry_backoff": shared.retry_backoff,
        "backend": shared.backend,
        "created_at": now,
    }


def format_concurrency_key(template: str, args: Any, kwargs: Any) -> str:
    """A ``@job``/``@task`` concurrency_key template formatted with a call's arguments."""
    try:
        return template.format(*(args or ()), **(kwargs or {}))
    except (IndexError, KeyError, ValueError, AttributeError) as exc:
        raise InvalidJob(
            f"concurrency_key {template!r} cannot be formatted with this job's arguments: {exc!r}."
        ) from None


def _concurrency(
    shared: Shared, key: str | None, args: Any, kwargs: Any
) -> tuple[str | None, int | None]:
    """(concurrency_key, concurrency_limit): the given ones, else the task's defaults,
    whose key is a format string over the job's arguments."""
    if key is None and shared.key_template is not None:
        key = format_concurrency_key(shared.key_template, args, kwargs)
    limit = shared.concurrency_limit
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
    job.trace_context = tracing.current_traceparent()
    saved, created = _insert(job, using)
    if created:
        transaction.on_commit(partial(_committed, [saved], using), using=using)
    return saved, created


def _committed(jobs: list[Job], using: str) -> None:
    """On commit: wake the workers, then tell ``jobs_enqueued``'s receivers."""
    announce.jobs_committed(jobs, using)
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
    notify = announce.notify_args(conn, job.queue) if due else None
    notified_at = time.monotonic()  # before the INSERT that carries the pg_notify
    # Outside a caller's transaction a deadlock between inserts of the same key (InnoDB
    # locks the duplicate's index record) can be retried: nothing else was rolled back.
    # Inside one it cannot: InnoDB rolled back the caller's whole transaction.
    retry_deadlocks = unique and not conn.in_atomic_block
    for _ in range(5):
        try:
            with transaction.mark_for_rollback_on_error(using):
                new_id = insert_one(Job, conn, values, text, unique, notify)
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
                values[announce.WOKEN] = notified_at
            return job, True
        existing = Job.objects.using(using).filter(unique_key=job.unique_key).first()
        if existing is not None:
            return existing, False
        # The holder of the key finished between our insert and our read: try again.
    raise InvalidJob(
        f"Could not enqueue unique job {job.unique_key!r}: the key kept changing hands."
    )
