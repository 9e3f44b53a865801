"""enqueue(): validate everything first, then write one row (enqueue_many(): bulk.py).

The options are defined in ``options.py``, a call's arguments are checked in
``arguments.py``; this module resolves the task, builds the Job and inserts it.
``aenqueue()`` is the same for async code.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from types import MappingProxyType
from typing import Any, Unpack

from asgiref.sync import sync_to_async
from django.db import OperationalError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState

from django_dbqueue import bounds, signals
from django_dbqueue.arguments import check_call
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import CrossDatabaseEnqueue, CrossDatabaseEnqueueWarning, InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.observability import tracing
from django_dbqueue.options import (
    NAMES,
    Defaults,
    EnqueueOptions,
    Shared,
    check_options,
    shared_attrs,
)
from django_dbqueue.queue import announce, clock
from django_dbqueue.queue.concurrency import ensure_keys
from django_dbqueue.queue.dialects import is_deadlock
from django_dbqueue.queue.insert import JSON_TEXT, insert_one, json_text
from django_dbqueue.registry import path_for_enqueue
from django_dbqueue.workflows import dependencies

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
EMPTY: Mapping[str, Any] = MappingProxyType({})


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


def check_shared(
    task: Any,
    defaults: Defaults,
    given: Mapping[str, Any] = EMPTY,
    *,
    backend: str = "",
    check_task: bool = True,
) -> Shared:
    """Validate the task and the options of ``given`` that do not depend on a job's
    arguments (``options.SHARED``). Raises InvalidJob.

    Options left at None take the task's ``@job`` defaults, then the ``DBQUEUE`` ones.
    With ``check_task`` off, ``task`` is a path the caller has checked itself.
    """
    parameters = None
    if check_task:
        path, task_defaults, parameters = path_for_enqueue(task, defaults.validate_tasks)
    else:
        path, task_defaults = bounds.check_text(str(task), "a task path"), EMPTY
    if len(path) > TASK_PATH_MAX:
        raise InvalidJob(f"a task path is at most {TASK_PATH_MAX} characters long.")
    return check_options(path, task_defaults, defaults, given, backend, parameters)


def build_job(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    backend: str = "",
    now: datetime | None = None,
    defaults: Defaults | None = None,
    check_task: bool = True,
    using: str | None = None,
    **given: Any,
) -> Job:
    """Validate one job and return it unsaved. Raises InvalidJob on any bad input.

    ``given`` are options of ``options.NAMES`` (the caller has refused other names).
    ``defaults`` lets a caller building many jobs read the settings once. Options left
    at None take the task's ``@job`` defaults, then the ``DBQUEUE`` ones. With
    ``check_task`` off, ``task`` is a path the caller has checked itself. Without
    ``now``, the time of the job database (``using``, when the caller has it) is read
    after the checks: bad input is refused before any query, the clock's included.
    """
    defaults = defaults or Defaults.read()
    shared = check_shared(task, defaults, given, backend=backend, check_task=check_task)
    # The options checked for each job (options.PER_JOB_NAMES), each in its own way.
    unique_key = given.get("unique_key")
    if unique_key is not None:
        bounds.check_unique_key(unique_key)
    call = check_call(
        shared,
        args,
        kwargs,
        given.get("concurrency_key"),
        given.get("concurrency_limit"),
        defaults,
    )
    now = now or clock.now(using or clock.job_database())
    job = new_job(
        {
            **shared_attrs(shared, now),
            "args": call.args,
            "kwargs": call.kwargs,
            "run_after": bounds.run_after_time(given.get("run_after"), now),
            "unique_key": unique_key,
            "origin_unique_key": unique_key,
            "concurrency_key": call.concurrency_key,
            "concurrency_limit": call.concurrency_limit,
            "errors": [],
        }
    )
    wanted = dependencies.wanted_of(given)
    if wanted is not None:
        job.__dict__[dependencies.DEPENDS] = wanted
    # The INSERT binds the text that was checked rather than serializing them again.
    job.__dict__[JSON_TEXT] = {
        "args": (call.args, call.args_text),
        "kwargs": (call.kwargs, call.kwargs_text),
    }
    return job


def enqueue(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """Add a job; it becomes visible to workers when the surrounding transaction commits.

    ``task`` is a registered task (an ``@job`` function or a Django ``@task``) or its
    dotted path; anything else raises InvalidJob. The options are those of
    ``options.OPTIONS``: queue, priority, run_after (datetime, timedelta or seconds),
    max_attempts, timeout, retry_backoff, unique_key, concurrency_key and
    concurrency_limit (default 1; docs/concurrency.md). With ``unique_key`` set and a
    job of that key still waiting or running, that job is returned instead of a new
    one. A misspelt option is a TypeError. From async code, ``await aenqueue(...)``.
    """
    refuse_event_loop("enqueue", "aenqueue")
    if options:
        bounds.unknown_options("enqueue()", options, NAMES)
    # Its time and its INSERT are the job database's, found once.
    using = router.db_for_write(Job)
    job, _created = save_job(build_job(task, args, kwargs, using=using, **options), using)
    return job


async def aenqueue(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """:func:`enqueue` for async code (an ``async def`` view, an async job): the same
    arguments, checks and result.

    It runs in the thread where Django's async ORM runs this code's queries
    (``sync_to_async``, thread-sensitive), so it joins a transaction opened there and the
    job becomes visible when that transaction commits, as with enqueue().
    """
    return await sync_to_async(enqueue, thread_sensitive=True)(task, args, kwargs, **options)


def refuse_event_loop(name: str, async_name: str) -> None:
    """InvalidJob when called where an event loop runs: Django would refuse the INSERT
    with SynchronousOnlyOperation, which does not say what to use instead.
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` lifts both refusals."""
    if asyncio._get_running_loop() is not None and not os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        raise InvalidJob(
            f"{name}() was called from async code (an event loop runs in this thread), "
            f"where Django refuses blocking queries: use `await {async_name}(...)`, which "
            f"takes the same arguments, or wrap the call in sync_to_async."
        )


def save_job(job: Job, using: str | None = None) -> tuple[Job, bool]:
    """Insert a job built by :func:`build_job` into the job database (``using``, when
    the caller has it); returns (job, created).

    With a ``unique_key`` that a waiting or running job holds, nothing is inserted and
    that job is returned with ``created=False``. A created job's ``jobs_enqueued`` is
    sent when the surrounding transaction commits.
    """
    using = using or router.db_for_write(Job)
    check_transaction(using)
    conn = connections[using]
    if job.concurrency_key is not None:
        ensure_keys(using, [job.concurrency_key])
    job.trace_context = tracing.current_traceparent()
    wanted = job.__dict__.pop(dependencies.DEPENDS, None)
    if wanted is None:
        saved, created = _insert(job, conn)
    else:  # its dependencies locked while it and its edges are written
        with transaction.atomic(using=using):
            edges = dependencies.prepare(job, using, wanted)
            saved, created = _insert(job, conn)
            if created:
                dependencies.link(using, saved.id, edges, wanted)
    if created:
        if conn.in_atomic_block or not conn.get_autocommit():
            transaction.on_commit(partial(_committed, [saved], using), using=using)
        else:  # committed already: what on_commit would do at once
            _committed([saved], using)
    return saved, created


def check_transaction(using: str) -> None:
    """Say so when the caller is inside a transaction of another database than the
    queue's ``using``: the job is committed on its own, whether that transaction commits
    or rolls back (``DBQUEUE['CROSS_DATABASE_ENQUEUE']``: warn, raise or ignore)."""
    if len(connections.settings) < 2:  # one database: no other transaction to be in
        return
    mode = settings.CROSS_DATABASE_ENQUEUE
    if mode == "ignore" or connections[using].in_atomic_block:
        return
    others = [
        conn.alias
        for conn in connections.all(initialized_only=True)
        if conn.alias != using and conn.in_atomic_block
    ]
    if not others:
        return
    message = (
        f"enqueue() inside a transaction of database {others[0]!r}, but the queue is in "
        f"{using!r}: the job is committed now, and stays if that transaction rolls back. "
        f"Enqueue in transaction.on_commit(..., using={others[0]!r}) or inside "
        f"atomic(using={using!r}) (docs/databases.md)."
    )
    if mode == "raise":
        raise CrossDatabaseEnqueue(message)
    warnings.warn(message, CrossDatabaseEnqueueWarning, stacklevel=4)


def _committed(jobs: list[Job], using: str) -> None:
    """On commit: wake the workers, then tell ``jobs_enqueued``'s receivers."""
    announce.jobs_committed(jobs, using)
    signals.jobs_enqueued.send(Job, jobs=jobs)


def _insert(job: Job, conn: BaseDatabaseWrapper) -> tuple[Job, bool]:
    """One INSERT statement, in the caller's transaction or (outside one) autocommitted
    by itself: no savepoint, no BEGIN/COMMIT of its own. On PostgreSQL the same
    statement makes the wake-up's pg_notify (sent on commit)."""
    using = conn.alias
    values = job.__dict__
    text = json_text(job)
    unique = job.unique_key is not None
    # Due when it was made (the database's clock only moves on), else the clock decides.
    due = job.run_after <= job.created_at or job.run_after <= clock.now(using)
    notify = announce.notify_args(conn, job.queue) if due else None
    notified_at = time.monotonic()  # before the INSERT that carries the pg_notify
    # Outside a caller's transaction a deadlock between inserts of the same key (InnoDB
    # locks the duplicate's index record) can be retried: nothing else was rolled back.
    # Inside one it cannot: InnoDB rolled back the caller's whole transaction.
    retry_deadlocks = unique and not conn.in_atomic_block
    for _ in range(5):
        try:
            if conn.in_atomic_block:  # (outside one there is nothing to mark)
                with transaction.mark_for_rollback_on_error(using):
                    new_id = insert_one(Job, conn, values, text, unique, notify)
            else:
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
