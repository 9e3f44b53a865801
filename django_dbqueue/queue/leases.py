"""CLAIMED stays CLAIMED: who owns a job, renewing leases, and recovering expired ones."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.apps import apps
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from django_dbqueue.conf import settings
from django_dbqueue.queue import clock
from django_dbqueue.queue.dialects import write_transaction
from django_dbqueue.queue.ends import settle
from django_dbqueue.status import CLAIMED, FAILED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job
    from django_dbqueue.queue.actions import JobQuerySet


def alive_since(now: datetime) -> datetime:
    """A worker process is alive while its heartbeat is later than this: younger than
    ``LEASE_TIMEOUT``, the age at which its jobs' leases would be taken back. The admin
    and the cluster metrics judge liveness by this one rule."""
    return now - timedelta(seconds=float(settings.LEASE_TIMEOUT))


def owned(model: type[Job], using: str, owner: str) -> JobQuerySet:
    """The claimed jobs of ``owner``.

    The guard that makes finishing exactly-once: only the current owner of a claimed job
    may finish it, and a second identical write matches nothing.
    """
    return model.objects.using(using).filter(status=CLAIMED, owner=owner)


def renew_leases(model: type[Job], using: str, owner: str, ids: Sequence[int]) -> int:
    """Heartbeat: keep the jobs this owner knows it holds from being recovered."""
    if not ids:
        return 0
    return owned(model, using, owner).filter(id__in=list(ids)).update(owner_date=clock.now(using))


def note_running(model: type[Job], using: str, owner: str, job_id: int, started: datetime) -> int:
    """A claimed job's attempt has run since ``started``: say so in its row while it runs.

    ``started_at`` keeps the first attempt's start (written only while NULL);
    ``last_attempted_at`` gets this one's. The worker writes the same values with the
    attempt's outcome; this write is for readers of a job that is still running.
    """
    when = Value(started, output_field=DateTimeField())
    return (
        owned(model, using, owner)
        .filter(id=job_id)
        .update(started_at=Coalesce(F("started_at"), when), last_attempted_at=when)
    )


def cancel_requested_ids(model: type[Job], using: str, owner: str, ids: Sequence[int]) -> set[int]:
    return set(
        owned(model, using, owner)
        .filter(id__in=list(ids), cancel_requested=True)
        .values_list("id", flat=True)
    )


def _unstarted(rows: list[tuple[int, str, int]], shown: dict[str, int | None]) -> set[int]:
    """Ids that provably had not started, from (id, owner, claim rank) rows.

    A worker runs its batch in claim order and records a job it may have been shown
    running (``WorkerProcess.running_job_id``) before it starts the next one. So while
    that job is still claimed, every job after it in the batch is waiting. Without such a
    job nothing can be told: any of them may have run.
    """
    waiting: set[int] = set()
    batches: dict[str, list[tuple[int, int]]] = {}
    for job_id, owner, rank in rows:
        batches.setdefault(owner, []).append((rank, job_id))
    for owner, batch in batches.items():
        ordered = [job_id for _, job_id in sorted(batch)]
        current = shown.get(owner)
        if current in ordered:
            waiting.update(ordered[ordered.index(current) + 1 :])
    return waiting


def recover_expired(
    model: type[Job], using: str, lease_timeout: float | None = None
) -> tuple[int, int]:
    """Requeue (or fail, when attempts are spent) jobs whose owner stopped renewing.

    A live supervisor renews its children's leases and settles a dead child's jobs
    itself, so what expires belongs to a host whose processes are all gone (or cut off
    from the database for longer than the lease). Jobs that provably had not started
    get back the attempt their claim counted (see :func:`_unstarted`); the others keep
    it. Returns (requeued, failed).
    """
    # From the app registry: models.py stands on this room (its manager is here).
    processes = apps.get_model("django_dbqueue", "WorkerProcess")
    lease = float(settings.LEASE_TIMEOUT if lease_timeout is None else lease_timeout)
    now = clock.now(using)
    cutoff = now - timedelta(seconds=lease)
    qs = model.objects.using(using)
    expired = qs.filter(status=CLAIMED, owner_date__lt=cutoff)
    requeued = failed = 0
    with write_transaction(using):
        rows = list(
            expired.select_for_update(skip_locked=True).values_list(
                "id", "owner", "attempts", "max_attempts", "priority", "run_after"
            )[:1000]
        )
        shown = dict(
            processes.objects.using(using)
            .filter(name__in={row[1] for row in rows})
            .values_list("name", "running_job_id")
        )
        # Claim order: priority DESC, run_after, id (queue/claim.py's CLAIM_ORDER).
        ranked = sorted(rows, key=lambda row: (-row[4], row[5], row[0]))
        waiting = _unstarted([(row[0], row[1], rank) for rank, row in enumerate(ranked)], shown)
        for job_id, owner, attempts, max_attempts, _, _ in rows:
            guard = qs.filter(id=job_id, status=CLAIMED, owner=owner, owner_date__lt=cutoff)
            lost = f"Recovered at {now.isoformat()}: worker {owner} stopped renewing its lease"
            if job_id in waiting:
                requeued += guard.update(
                    status=QUEUED,
                    owner_date=None,
                    run_after=now,
                    attempts=F("attempts") - 1,
                    last_error=f"{lost} before it started this job (attempt not counted).",
                )
                continue
            doing = " while running this job" if shown.get(owner) == job_id else ""
            message = f"{lost}{doing} (attempt {attempts} of {max_attempts} counted)."
            if attempts >= max_attempts:
                ended = guard.update(
                    status=FAILED, finished_at=now, unique_key=None, last_error=message
                )
                if ended:
                    settle(model, using, {job_id: FAILED})
                failed += ended
            else:
                requeued += guard.update(
                    status=QUEUED, owner_date=None, run_after=now, last_error=message
                )
    return requeued, failed
