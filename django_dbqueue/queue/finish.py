"""CLAIMED -> DONE, FAILED, CANCELLED or back to QUEUED: recording how an attempt ended.

Every write is guarded by (status = claimed, owner = this worker), so a write repeated
after a lost reply, or made after another worker recovered the job, changes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from django_dbqueue.conf import settings
from django_dbqueue.queue import announce, clock
from django_dbqueue.queue.concurrency import release_freed
from django_dbqueue.queue.dialects import dialect, write_transaction
from django_dbqueue.queue.ends import settle
from django_dbqueue.queue.leases import owned
from django_dbqueue.status import CANCELLED, CLAIMED, DONE, FAILED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job


def retry_delay(attempts: int, base: float | None = None) -> float:
    """Exponential backoff with jitter for the retry after ``attempts`` tries."""
    first = settings.RETRY_BACKOFF if base is None else base
    delay: float = min(float(settings.RETRY_BACKOFF_MAX), first * 2 ** max(attempts - 1, 0))
    jitter = float(settings.RETRY_JITTER)
    return max(0.0, delay * random.uniform(1 - jitter, 1 + jitter))


def finish_done(model: type[Job], using: str, owner: str, jobs: Sequence[Job]) -> set[int]:
    """Record jobs as DONE in one guarded UPDATE; return the ids actually finished.

    Jobs another worker took over meanwhile (our lease ran out) are left alone. This
    runs once per batch on the hot path, so it is one statement, in autocommit,
    written by hand: the ORM spends longer building a CASE over a hundred rows than
    the database spends running it. Jobs of a workflow (dependents, a batch) are
    finished in a transaction of their own with their dependents and batch counts
    (:func:`_finish_workflow`); the plain UPDATE leaves alone any row marked as one
    after the claim read it (a dependent enqueued while it ran), which then goes there.
    """
    if not jobs:
        return set()
    plain = [job for job in jobs if not job.__dict__.get("workflow")]
    finished = set()
    if plain:
        ids = [j.id for j in plain]
        updated = _update_done(model, using, owner, plain, plain_only=True)
        finished = set(ids) if updated == len(ids) else _done_by(model, using, owner, ids)
    rest = [job for job in jobs if job.id not in finished]
    if rest:
        finished |= _finish_workflow(model, using, owner, rest)
    now, ended = clock.now(using), _ends(jobs)
    for job in jobs:
        if job.id in finished:
            job.status, job.unique_key, job.cancel_requested = DONE, None, False
            job.finished_at = ended.get(job.id, now)
    free_slots(model, using, [job for job in jobs if job.id in finished])
    return finished


def _finish_workflow(model: type[Job], using: str, owner: str, jobs: Sequence[Job]) -> set[int]:
    """DONE for jobs that may have dependents or a batch (or were taken over), with
    their dependents released and their batch counts moved in the same transaction."""
    ids = [job.id for job in jobs]
    with write_transaction(using):
        # Locked by primary key only (InnoDB locks every index record a locking read
        # scans: a status index would lock other workers' claimed rows); ours checked here.
        locked = model.objects.using(using).select_for_update().filter(id__in=ids)
        fields = ("id", "batch_id", "batch_counted", "status", "owner")
        rows = [r[:3] for r in locked.values_list(*fields) if r[3:] == (CLAIMED, owner)]
        if not rows:
            return set()
        ours = {row[0] for row in rows}
        # Batch members are counted by the same UPDATE (batch_counted), so a member's
        # finish writes its row once and one counter shard.
        members = [(job_id, batch) for job_id, batch, counted in rows if batch and not counted]
        done = [j for j in jobs if j.id in ours]
        _update_done(model, using, owner, done, plain_only=False, count=bool(members))
        settle(model, using, dict.fromkeys(ours, DONE), members)
    return ours


def _update_done(
    model: type[Job],
    using: str,
    owner: str,
    jobs: Sequence[Job],
    plain_only: bool,
    count: bool = False,
) -> int:
    """The guarded UPDATE to DONE of ``jobs`` (with ``plain_only``, of rows not marked
    ``workflow``; with ``count``, marking batch members counted); returns the row count."""
    conn = connections[using]
    meta = model._meta
    qn = conn.ops.quote_name
    now = clock.now(using)
    assignments = [f"{qn('status')} = %s", f"{qn('unique_key')} = NULL"]
    assignments.append(f"{qn('cancel_requested')} = %s")
    params: list[Any] = [DONE, meta.get_field("cancel_requested").get_db_prep_value(False, conn)]
    if count:
        assignments.append(f"{qn('batch_counted')} = %s")
        params.append(True)
    ids = [j.id for j in jobs]
    speaks = dialect(conn)
    # The rows by primary key; started_at is the first attempt's start: written only
    # while NULL (the supervisor may have written it while the attempt ran). Start times
    # are aware datetimes. finished_at is when the job's code
    # returned, as the run noted it, not the time of this (batched) write. (__dict__: a
    # claimed job's result, start and end are not read from the row; only what the run
    # set counts.)
    started = {j.id: value for j in jobs if (value := j.__dict__.get("started_at")) is not None}
    rows = speaks.done_rows(conn, qn(meta.db_table), ids, started, _ends(jobs), now)
    assignments.append(rows.finished)
    params += rows.finished_params
    if rows.started is not None:
        assignments.append(rows.started)
        params += rows.started_params
    # last_attempted_at: later attempts only.
    adapt = conn.ops.adapt_datetimefield_value
    _per_job(qn, jobs, "last_attempted_at", adapt, assignments, params)
    result: Any = meta.get_field("result")
    prepare = partial(result.get_db_prep_value, connection=conn)
    _per_job(qn, jobs, "result", prepare, assignments, params)
    # Only quoted column names and %s placeholders are formatted in; every value
    # goes through the driver's parameters.
    guarded, guard_params = _guard(qn, owner, plain_only)
    guard = speaks.by_id_only(guarded)
    sql = (
        f"UPDATE {rows.target} SET {', '.join(assignments)} "  # noqa: S608
        f"WHERE {rows.where} AND {guard}"
    )
    args = [*rows.target_params, *params, *rows.where_params, *guard_params]
    with conn.cursor() as cursor:
        cursor.execute(sql, args)
        return int(cursor.rowcount)


def _ends(jobs: Sequence[Job]) -> dict[int, Any]:
    """When each job's code returned, as its run noted it (none: the write's time)."""
    return {j.id: value for j in jobs if (value := j.__dict__.get("finished_at")) is not None}


def _guard(qn: Any, owner: str, plain_only: bool) -> tuple[str, list[Any]]:
    """The finish's guard: still claimed by ``owner`` (and, with ``plain_only``, not
    marked ``workflow``: such a row is finished with its dependents instead)."""
    if plain_only:
        sql = f"{qn('status')} = %s AND {qn('owner')} = %s AND {qn('workflow')} = %s"
        return sql, [CLAIMED, owner, False]
    return f"{qn('status')} = %s AND {qn('owner')} = %s", [CLAIMED, owner]


def _per_job(
    qn: Any,
    jobs: Sequence[Job],
    name: str,
    prepare: Callable[[Any], Any],
    assignments: list[str],
    params: list[Any],
) -> None:
    """Add ``name = CASE id ...`` and its parameters for the jobs whose run set ``name``
    (``prepare``: the value as the driver takes it); nothing when none did."""
    values = [(j.id, value) for j in jobs if (value := j.__dict__.get(name)) is not None]
    if values:
        assignments.append(_case(qn, name, len(values)))
        for job_id, value in values:
            params += [job_id, prepare(value)]


def _done_by(model: type[Job], using: str, owner: str, ids: list[int]) -> set[int]:
    """Some were taken over; the ones now DONE under our name are the ones we wrote."""
    return set(
        model.objects.using(using)
        .filter(id__in=ids, status=DONE, owner=owner)
        .values_list("id", flat=True)
    )


def free_slots(model: type[Job], using: str, jobs: Iterable[Job]) -> None:
    """Jobs left CLAIMED (the write committed): their keys' parked jobs may run now.

    Nothing for jobs without a concurrency key (a check of attributes already read).
    The released jobs' queues are told (the wake-up channel) so idle workers claim them
    now rather than at their next poll. (``__dict__``: a job built from a log entry does
    not know its key, and reading it would cost a query; the claims' periodic
    :func:`~django_dbqueue.queue.concurrency.release_parked` covers those.)
    """
    keys = [key for job in jobs if (key := job.__dict__.get("concurrency_key")) is not None]
    if not keys:
        return
    queues = release_freed(model, using, keys)
    if queues:
        announce.notify(queues)


def _case(qn: Any, name: str, count: int) -> str:
    """``name = CASE id WHEN %s THEN %s ... ELSE name END`` for ``count`` jobs."""
    whens = " ".join(["WHEN %s THEN %s"] * count)
    return f"{qn(name)} = CASE {qn('id')} {whens} ELSE {qn(name)} END"


def finish_failed_attempt(
    model: type[Job], using: str, owner: str, job: Job, error: str, error_class: str
) -> str | None:
    """Record a failed attempt: back to QUEUED with backoff, or FAILED when spent.

    Returns the new status, or None when the job was no longer ours to finish.
    """
    now = clock.now(using)
    errors = _with_error(job, error, error_class, owner, now)
    fields: dict[str, Any] = {"last_error": error, "errors": errors, "cancel_requested": False}
    if job.last_attempted_at is not None:
        fields["last_attempted_at"] = job.last_attempted_at
    if job.attempts >= job.max_attempts:
        fields.update(status=FAILED, finished_at=now, unique_key=None)
    else:
        delay = retry_delay(job.attempts, job.retry_backoff)
        fields.update(status=QUEUED, run_after=now + timedelta(seconds=delay), owner_date=None)
    writes: dict[str, Any] = dict(fields)
    if job.started_at is not None:
        # The first attempt's start: written only while NULL.
        writes["started_at"] = Coalesce(F("started_at"), Value(job.started_at, DateTimeField()))
    final = fields["status"] == FAILED
    with write_transaction(using) if final else nullcontext():
        if not owned(model, using, owner).filter(id=job.id).update(**writes):
            return None
        if final:
            settle(model, using, {job.id: FAILED})
    for name, value in fields.items():
        setattr(job, name, value)
    free_slots(model, using, [job])
    return str(fields["status"])


def _with_error(
    job: Job, error: str, error_class: str, owner: str, now: Any
) -> list[dict[str, Any]]:
    """The job's error history with this one added (the last KEEP_ERRORS kept)."""
    errors = list(job.errors or [])
    entry = {"exception_class_path": error_class, "traceback": error, "at": now.isoformat()}
    errors.append({**entry, "worker": owner})
    return errors[-int(settings.KEEP_ERRORS) :]


def give_back_suspect(
    model: type[Job], using: str, owner: str, job: Job, error: str, error_class: str
) -> bool:
    """A job whose process died while it ran beside others, which one caused it unknown:
    back to the queue at once, attempt not counted, the death added to its errors (the
    mark by which a worker runs it alone from now on: worker/deaths.py)."""
    errors = _with_error(job, error, error_class, owner, clock.now(using))
    return _back_uncharged(model, using, owner, job.id, last_error=error, errors=errors)


def _back_uncharged(model: type[Job], using: str, owner: str, job_id: int, **fields: Any) -> bool:
    """Back to the queue, the claim's attempt not counted, ``fields`` written too."""
    updated = (
        owned(model, using, owner)
        .filter(id=job_id)
        .update(status=QUEUED, owner_date=None, attempts=F("attempts") - 1, **fields)
    )
    return bool(updated)


def give_back(model: type[Job], using: str, owner: str, ids: Sequence[int]) -> int:
    """Return claimed jobs that never started: runnable at once, attempt not counted.

    Their keys' parked jobs stay parked: a job given back is runnable at once and takes
    its slot again at the next claim, which would only park a released one again.
    """
    if not ids:
        return 0
    return (
        owned(model, using, owner)
        .filter(id__in=list(ids))
        .update(status=QUEUED, owner_date=None, attempts=F("attempts") - 1)
    )


def cancel_claimed(model: type[Job], using: str, owner: str, job: Job, reason: str) -> bool:
    now = clock.now(using)
    with write_transaction(using):
        cancelled = bool(
            owned(model, using, owner)
            .filter(id=job.id)
            .update(status=CANCELLED, finished_at=now, unique_key=None, last_error=reason)
        )
        if cancelled:
            settle(model, using, {job.id: CANCELLED})
    if cancelled:
        free_slots(model, using, [job])
    return cancelled


def retry_later(
    model: type[Job], using: str, owner: str, job: Job, delay: float, reason: str
) -> bool:
    """The job asked to run again later (RetryJob): requeue it, attempt not counted."""
    run_after = clock.now(using) + timedelta(seconds=delay)
    reason = f"Deferred by the job itself: {reason}"
    updated = _back_uncharged(model, using, owner, job.id, run_after=run_after, last_error=reason)
    if updated:
        job.status, job.run_after, job.attempts = QUEUED, run_after, job.attempts - 1
        free_slots(model, using, [job])
    return bool(updated)
