"""CLAIMED -> DONE, FAILED, CANCELLED or back to QUEUED: recording how an attempt ended.

Every write is guarded by (status = claimed, owner = this worker), so a write repeated
after a lost reply, or made after another worker recovered the job, changes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from django_dbqueue.conf import settings
from django_dbqueue.queue.dialects import placeholders
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
    the database spends running it.
    """
    if not jobs:
        return set()
    conn = connections[using]
    meta = model._meta
    qn = conn.ops.quote_name
    now = timezone.now()
    assignments = [
        f"{qn('status')} = %s",
        f"{qn('finished_at')} = %s",
        f"{qn('unique_key')} = NULL",
        f"{qn('cancel_requested')} = %s",
    ]
    params: list[Any] = [
        DONE,
        meta.get_field("finished_at").get_db_prep_value(now, conn),
        meta.get_field("cancel_requested").get_db_prep_value(False, conn),
    ]
    # started_at is the first attempt's start: written only while NULL (the supervisor
    # may have written it while the attempt ran). last_attempted_at: later attempts only.
    for name, template in (
        ("started_at", "COALESCE({col}, CASE {id} {whens} ELSE NULL END)"),
        ("last_attempted_at", "CASE {id} {whens} ELSE {col} END"),
        ("result", "CASE {id} {whens} ELSE {col} END"),
    ):
        field: Any = meta.get_field(name)
        rows = [(j.id, getattr(j, name)) for j in jobs if getattr(j, name) is not None]
        if rows:
            whens = " ".join(["WHEN %s THEN %s"] * len(rows))
            value_sql = template.format(col=qn(name), id=qn("id"), whens=whens)
            assignments.append(f"{qn(name)} = {value_sql}")
            for job_id, value in rows:
                params += [job_id, field.get_db_prep_value(value, conn)]
    ids = [j.id for j in jobs]
    # Only quoted column names and %s placeholders are formatted in; every value
    # goes through the driver's parameters.
    sql = (
        f"UPDATE {qn(meta.db_table)} SET {', '.join(assignments)} "  # noqa: S608
        f"WHERE {qn('id')} IN ({placeholders(len(ids))}) "
        f"AND {qn('status')} = %s AND {qn('owner')} = %s"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [*params, *ids, CLAIMED, owner])
        updated = cursor.rowcount
    if updated == len(ids):
        finished = set(ids)
    else:
        # Some were taken over; the ones now DONE under our name are the ones we wrote.
        finished = set(
            model.objects.using(using)
            .filter(id__in=ids, status=DONE, owner=owner)
            .values_list("id", flat=True)
        )
    for job in jobs:
        if job.id in finished:
            job.status, job.finished_at, job.unique_key = DONE, now, None
            job.cancel_requested = False
    return finished


def finish_failed_attempt(
    model: type[Job], using: str, owner: str, job: Job, error: str, error_class: str
) -> str | None:
    """Record a failed attempt: back to QUEUED with backoff, or FAILED when spent.

    Returns the new status, or None when the job was no longer ours to finish.
    """
    now = timezone.now()
    errors = list(job.errors or [])
    errors.append(
        {
            "exception_class_path": error_class,
            "traceback": error,
            "at": now.isoformat(),
            "worker": owner,
        }
    )
    errors = errors[-int(settings.KEEP_ERRORS) :]
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
    if not owned(model, using, owner).filter(id=job.id).update(**writes):
        return None
    for name, value in fields.items():
        setattr(job, name, value)
    return str(fields["status"])


def give_back(model: type[Job], using: str, owner: str, ids: Sequence[int]) -> int:
    """Return claimed jobs that never started: runnable at once, attempt not counted."""
    if not ids:
        return 0
    return (
        owned(model, using, owner)
        .filter(id__in=list(ids))
        .update(status=QUEUED, owner_date=None, attempts=F("attempts") - 1)
    )


def cancel_claimed(model: type[Job], using: str, owner: str, job: Job, reason: str) -> bool:
    now = timezone.now()
    return bool(
        owned(model, using, owner)
        .filter(id=job.id)
        .update(status=CANCELLED, finished_at=now, unique_key=None, last_error=reason)
    )


def retry_later(
    model: type[Job], using: str, owner: str, job: Job, delay: float, reason: str
) -> bool:
    """The job asked to run again later (RetryJob): requeue it, attempt not counted."""
    run_after = timezone.now() + timedelta(seconds=delay)
    updated = (
        owned(model, using, owner)
        .filter(id=job.id)
        .update(
            status=QUEUED,
            run_after=run_after,
            owner_date=None,
            attempts=F("attempts") - 1,
            last_error=f"Deferred by the job itself: {reason}",
        )
    )
    if updated:
        job.status, job.run_after, job.attempts = QUEUED, run_after, job.attempts - 1
    return bool(updated)
