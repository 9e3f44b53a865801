"""CLAIMED stays CLAIMED: who owns a job, renewing leases, and recovering expired ones."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db.models import F
from django.utils import timezone

from django_dbqueue.conf import settings
from django_dbqueue.queue.dialects import write_transaction
from django_dbqueue.status import CLAIMED, FAILED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job
    from django_dbqueue.queue.actions import JobQuerySet


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
    return owned(model, using, owner).filter(id__in=list(ids)).update(owner_date=timezone.now())


def cancel_requested_ids(model: type[Job], using: str, owner: str, ids: Sequence[int]) -> set[int]:
    return set(
        owned(model, using, owner)
        .filter(id__in=list(ids), cancel_requested=True)
        .values_list("id", flat=True)
    )


def recover_expired(
    model: type[Job], using: str, lease_timeout: float | None = None
) -> tuple[int, int]:
    """Requeue (or fail, when attempts are spent) jobs whose owner stopped renewing.

    A live supervisor renews its children's leases and settles a dead child's jobs
    itself, so what expires belongs to a host whose processes are all gone. The dead
    worker's row (``WorkerProcess``) names the job it was running: that one is charged
    the attempt the claim counted; the others had not started, and get it back. Without
    a row to tell, the attempt stays counted. Returns (requeued, failed).
    """
    from django_dbqueue.models import WorkerProcess

    lease = float(settings.LEASE_TIMEOUT if lease_timeout is None else lease_timeout)
    now = timezone.now()
    cutoff = now - timedelta(seconds=lease)
    qs = model.objects.using(using)
    expired = qs.filter(status=CLAIMED, owner_date__lt=cutoff)
    requeued = failed = 0
    with write_transaction(using):
        rows = list(
            expired.select_for_update(skip_locked=True).values_list(
                "id", "owner", "attempts", "max_attempts"
            )[:1000]
        )
        running = dict(
            WorkerProcess.objects.using(using)
            .filter(name__in={row[1] for row in rows})
            .values_list("name", "running_job_id")
        )
        for job_id, owner, attempts, max_attempts in rows:
            guard = qs.filter(id=job_id, status=CLAIMED, owner=owner, owner_date__lt=cutoff)
            lost = f"Recovered at {now.isoformat()}: worker {owner} stopped renewing its lease"
            if owner in running and running[owner] != job_id:
                requeued += guard.update(
                    status=QUEUED,
                    owner_date=None,
                    run_after=now,
                    attempts=F("attempts") - 1,
                    last_error=f"{lost} before it started this job (attempt not counted).",
                )
                continue
            doing = " while running this job" if owner in running else ""
            message = f"{lost}{doing} (attempt {attempts} of {max_attempts} counted)."
            if attempts >= max_attempts:
                failed += guard.update(
                    status=FAILED, finished_at=now, unique_key=None, last_error=message
                )
            else:
                requeued += guard.update(
                    status=QUEUED, owner_date=None, run_after=now, last_error=message
                )
    return requeued, failed
