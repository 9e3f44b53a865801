"""enqueue_many(): every job validated, then all of them inserted in multi-row statements.

Jobs that name the same task with the same options share that part of their validation:
the task's path and defaults, the queue and the option ranges are checked once per
combination (:class:`~django_dbqueue.options.Shared`); each job has only its own
arguments (JSON, size) and the options of ``scope="job"`` (``run_after``, its
concurrency key and limit) checked. The INSERT takes the
validated values column by column, and the Job objects returned are built from the same
values and the new ids, without ``Model.__init__``.
"""

from __future__ import annotations

import gc
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import router, transaction
from django.db.models.base import ModelState

from django_dbqueue import bounds, signals
from django_dbqueue.arguments import Call, check_call
from django_dbqueue.enqueueing import check_shared, check_transaction, new_job, refuse_event_loop
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.observability import tracing
from django_dbqueue.options import (
    MANY_NAMES,
    NAMES,
    SHARED,
    SHARED_NAMES,
    Defaults,
    Shared,
    shared_attrs,
)
from django_dbqueue.queue import announce, clock
from django_dbqueue.queue.concurrency import ensure_keys
from django_dbqueue.queue.insert import insert_columns
from django_dbqueue.workflows import graph


@dataclass
class JobSpec:
    """One job of an :func:`enqueue_many` call."""

    task: Any
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


# The keys of a job given as a dict that are not options.
_CALL_KEYS = frozenset({"task", "args", "kwargs"})
_NO_TASK = object()
# Options enqueue() takes and enqueue_many() refuses (unique_key), with the reason.
_REFUSED = {
    "unique_key": "enqueue_many() does not take unique_key: its multi-row INSERT is one "
    "statement, so one taken key would fail the whole batch; use enqueue() for unique jobs.",
}
# Items with depends_on (or its rule) are enqueued by workflows/graph.py.
_EDGES = frozenset({"depends_on", "on_dependency_failure"})
assert _REFUSED.keys() == set(NAMES) - MANY_NAMES - _EDGES, "say why enqueue_many() refuses"
# Option values whose equality means the same validation (exact types: a subclass may
# define its own equality, and True == 1 is a bool where an integer is wanted).
_SAME_IF_EQUAL = frozenset({str, int, float, bool, type(None), datetime, timedelta})


def enqueue_many(jobs: Iterable[JobSpec | Mapping[str, Any]], batch_size: int = 1000) -> list[Job]:
    """Validate every job and insert them all, ``batch_size`` rows per statement, in
    one transaction (a savepoint inside the caller's); returns the saved jobs, in order.

    Each item is a :class:`JobSpec` or a dict with the keys of :func:`enqueue`. The
    items are read first, then validated a batch at a time, each batch before its
    INSERT: an invalid item (InvalidJob, or TypeError for a misspelt option, naming the
    job's index) rolls back the batches before it, so nothing is written.

    An item's ``depends_on`` may name jobs, ids, or other items of the call as
    ``item(index)`` (:mod:`django_dbqueue.workflows.graph`): such a call inserts its
    items one by one, in dependency order; a cycle or an index out of range is refused.

    ``unique_key`` is refused: one multi-row INSERT cannot skip the rows whose key is
    taken (MariaDB's INSERT IGNORE would also swallow every other error), so use
    :func:`enqueue` for unique jobs. From async code, ``await aenqueue_many(...)``.
    """
    refuse_event_loop("enqueue_many", "aenqueue_many")
    # The caller's iterable is read before any statement: it may query the database.
    items = jobs if isinstance(jobs, list | tuple) else list(jobs)
    try:
        return _enqueue_plain(items, batch_size)
    except _WithEdges:  # rolled back: inserted one by one, in dependency order
        return graph.enqueue_graph(items, _refuse)


class _WithEdges(Exception):
    """An item gives ``depends_on`` (or its rule): the call is one for workflows/graph.py."""


def _enqueue_plain(items: Sequence[JobSpec | Mapping[str, Any]], batch_size: int) -> list[Job]:
    with _no_cyclic_gc():
        many = _Validated(clock.queue_now(), Defaults.read())
        if not items:
            return []
        using = router.db_for_write(Job)
        check_transaction(using)
        created: list[Job] = []
        with transaction.atomic(using=using):
            # Each batch is validated before its INSERT (on MariaDB, while the one before
            # runs); a bad job rolls back what was inserted. Each statement's jobs are
            # built once its ids are known (on MariaDB, while the next statement runs).
            insert_columns(
                Job,
                using,
                many.batches(items, batch_size),
                lambda start, stop, ids: created.extend(many.jobs(start, stop, ids, using)),
            )
            keys = [call.concurrency_key for call in many.calls if call.concurrency_key]
            if keys:
                ensure_keys(using, keys)
    # Jobs without a run_after of their own are due: their queues are announced without
    # looking at each job (announce.jobs_committed() compares each one's run_after).
    due = None if many.delayed else {shared.columns["queue"] for shared in many.distinct_shared()}
    transaction.on_commit(partial(_committed, created, using, due), using=using)
    return created


async def aenqueue_many(
    jobs: Iterable[JobSpec | Mapping[str, Any]], batch_size: int = 1000
) -> list[Job]:
    """:func:`enqueue_many` for async code: the same arguments, checks and result, run
    where Django's async ORM runs this code's queries (as ``aenqueue()``)."""
    return await sync_to_async(enqueue_many, thread_sensitive=True)(jobs, batch_size)


def _committed(jobs: list[Job], using: str, due: set[str] | None) -> None:
    """On commit: wake the workers of ``due`` queues (None: of the jobs due now), then
    tell ``jobs_enqueued``'s receivers."""
    if due is None:
        announce.jobs_committed(jobs, using)
    else:
        announce.notify(due, using=using)
    signals.jobs_enqueued.send(Job, jobs=jobs)


def _refuse(options: Mapping[str, Any]) -> None:
    """InvalidJob for an option enqueue_many() does not take (unique_key)."""
    for name, reason in _REFUSED.items():
        if options.get(name) is not None:
            raise InvalidJob(reason)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector paused (if it was on) while a call builds its jobs.

    Every container allocated counts towards a collection, and each collection walks
    every young object: with a few allocations per job, collections of a growing list
    of jobs cost more than validating them (4 of 7 us per job, measured). Nothing
    here makes reference cycles; other threads' cycles wait for the end of the call.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Validated:
    """The jobs of one enqueue_many() call, validated as they are added."""

    def __init__(self, now: datetime, defaults: Defaults) -> None:
        self.now = now
        self.defaults = defaults
        # (task, options) -> (the task object, kept alive while its id is a key; Shared)
        self.known: dict[Hashable, tuple[Any, Shared]] = {}
        self.calls: list[Call] = []
        self.shared: list[Shared] = []
        self.run_after: list[datetime] = []
        self.delayed = False  # a job has a run_after of its own
        # id(Shared) -> the attributes of its jobs (Shared values are kept in self.shared)
        self.templates: dict[int, dict[str, Any]] = {}
        # Every job of the call carries the enqueuing span's trace (observability/tracing).
        self.trace_context = tracing.current_traceparent()

    def batches(
        self, items: Sequence[JobSpec | Mapping[str, Any]], size: int
    ) -> Iterator[tuple[int, dict[str, Any], dict[str, list[Any]]]]:
        """(count, values, per_row) of each ``size`` items, validated when asked for."""
        for start in range(0, len(items), size):
            for index in range(start, min(start + size, len(items))):
                try:
                    self.add(items[index])
                except InvalidJob as exc:
                    raise InvalidJob(f"job {index}: {exc}") from None
                except TypeError as exc:  # a misspelt option: a mistake of the calling code
                    raise TypeError(f"job {index}: {exc}") from None
            yield len(self.calls) - start, *self.columns(start)

    def add(self, item: JobSpec | Mapping[str, Any]) -> None:
        task: Any
        args: Any
        kwargs: Any
        options: dict[str, Any] | None
        if type(item) is not dict and isinstance(item, JobSpec):
            task, args, kwargs, options = item.task, item.args, item.kwargs, item.options
        else:
            if type(item) is not dict and not isinstance(item, Mapping):
                item = dict(item)
            task = item.get("task", _NO_TASK)
            if task is _NO_TASK:
                raise InvalidJob("every job needs a 'task'.")
            args, kwargs = item.get("args"), item.get("kwargs")
            keys = item.keys()
            options = None if keys <= _CALL_KEYS else {k: item[k] for k in keys - _CALL_KEYS}
        # The options checked for each job (options.PER_JOB_NAMES), each in its own way.
        run_after = concurrency_key = concurrency_limit = None
        if options:
            if not options.keys() <= MANY_NAMES:
                bounds.unknown_options("enqueue_many()", options, NAMES)
                _refuse(options)
                for name in _EDGES:
                    if options.get(name) is not None:
                        raise _WithEdges
            run_after = options.get("run_after")
            concurrency_key = options.get("concurrency_key")
            concurrency_limit = options.get("concurrency_limit")
        shared = self._shared(task, options)
        self.calls.append(
            check_call(shared, args, kwargs, concurrency_key, concurrency_limit, self.defaults)
        )
        self.shared.append(shared)
        if run_after is None:
            self.run_after.append(self.now)
        else:
            self.run_after.append(bounds.run_after_time(run_after, self.now))
            self.delayed = True

    def _shared(self, task: Any, options: dict[str, Any] | None) -> Shared:
        """The task and options validated, once per combination."""
        key: Hashable | None = task if type(task) is str else id(task)
        if options:
            parts: list[Any] = [key]
            for name, value in options.items():
                if name in SHARED_NAMES:
                    if type(value) not in _SAME_IF_EQUAL:
                        key = None
                        break
                    parts += (name, type(value), value)
            else:
                key = tuple(parts)
        known = self.known.get(key) if key is not None else None
        if known is not None:
            return known[1]
        shared = check_shared(task, self.defaults, options or {})
        if key is not None:
            self.known[key] = (task, shared)
        return shared

    def distinct_shared(self, start: int = 0) -> list[Shared]:
        """The Shared values of the jobs from ``start`` on, each once."""
        shared = self.shared[start:] if start else self.shared
        first = shared[0]
        if all(one is first for one in shared):
            return [first]
        return list({id(one): one for one in shared}.values())

    def columns(self, start: int) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        """(values of every row, values per row) of the jobs from ``start`` on, for
        :func:`insert_columns`."""
        calls = self.calls[start:]
        values: dict[str, Any] = {
            "errors": [],
            "created_at": self.now,
            "trace_context": self.trace_context,
        }
        per_row: dict[str, list[Any]] = {
            "args": [call.args_text for call in calls],
            "kwargs": [call.kwargs_text for call in calls],
        }
        shared = self.distinct_shared(start)
        if len(shared) == 1:
            values.update(shared_attrs(shared[0], self.now))
        else:
            mixed = self.shared[start:]
            per_row["task"] = [one.path for one in mixed]
            per_row["backend"] = [one.backend for one in mixed]
            for option in SHARED:
                per_row[option.name] = [one.columns[option.name] for one in mixed]
        if self.delayed:
            per_row["run_after"] = self.run_after[start:]
        else:
            values["run_after"] = self.now
        if any(call.concurrency_key is not None for call in calls):
            per_row["concurrency_key"] = [call.concurrency_key for call in calls]
            per_row["concurrency_limit"] = [call.concurrency_limit for call in calls]
        return values, per_row

    def jobs(self, start: int, stop: int, new_ids: list[int] | None, using: str) -> list[Job]:
        """The saved jobs ``start:stop`` (ids None where the database does not return
        them: MySQL)."""
        templates = self.templates
        ids = new_ids if new_ids is not None else [None] * (stop - start)
        make = Job.__new__
        created: list[Job] = []
        for new_id, call, shared, run_after in zip(
            ids,
            self.calls[start:stop],
            self.shared[start:stop],
            self.run_after[start:stop],
            strict=True,
        ):
            template = templates.get(id(shared))
            if template is None:
                template = templates[id(shared)] = self._template(shared)
            attrs = template.copy()
            attrs["id"] = new_id
            attrs["args"] = call.args
            attrs["kwargs"] = call.kwargs
            attrs["run_after"] = run_after
            attrs["errors"] = []
            if call.concurrency_key is not None:
                attrs["concurrency_key"] = call.concurrency_key
                attrs["concurrency_limit"] = call.concurrency_limit
            state = ModelState()
            if new_id is not None:
                state.adding, state.db = False, using
            attrs["_state"] = state
            job = make(Job)
            job.__dict__ = attrs
            created.append(job)
        return created

    def _template(self, shared: Shared) -> dict[str, Any]:
        attrs = new_job(
            {
                **shared_attrs(shared, self.now),
                "args": [],
                "kwargs": {},
                "run_after": self.now,
                "errors": [],
                "unique_key": None,
                "origin_unique_key": None,
                "concurrency_key": None,
                "concurrency_limit": None,
                "trace_context": self.trace_context,
            }
        ).__dict__
        attrs.pop("_state")
        return attrs
