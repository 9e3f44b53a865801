"""The SQL of the queue: claiming, finishing, renewing leases and recovery.

Every write here goes by primary key or by the indexes declared on ``Job``; every
transaction is short and never spans a job's execution. Database differences live in
:func:`claim_transaction` and nowhere else.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router, transaction
from django.db.models import F
from django.utils import timezone

from django_dbqueue.conf import settings

if TYPE_CHECKING:
    from django_dbqueue.models import Job

QUEUED, CLAIMED, DONE, FAILED, CANCELLED = "queued", "claimed", "done", "failed", "cancelled"
CLAIM_ORDER = ("-priority", "run_after", "id")


@contextmanager
def claim_transaction(using: str) -> Iterator[None]:
    """A short write transaction suited to claiming on this database.

    SQLite has no ``SELECT ... FOR UPDATE``: the transaction takes the write lock at
    BEGIN (IMMEDIATE), so two claimers queue on the busy timeout instead of both
    reading the same rows and one failing to upgrade its lock.
    """
    connection = connections[using]
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
        return
    connection.ensure_connection()  # connecting resets transaction_mode from OPTIONS
    previous = connection.transaction_mode  # type: ignore[attr-defined]
    connection.transaction_mode = "IMMEDIATE"  # type: ignore[attr-defined]
    try:
        with transaction.atomic(using=using):
            connection.transaction_mode = previous  # type: ignore[attr-defined]
            yield
    finally:
        connection.transaction_mode = previous  # type: ignore[attr-defined]


def retry_delay(attempts: int, base: float | None = None) -> float:
    """Exponential backoff with jitter for the retry after ``attempts`` tries."""
    first = settings.RETRY_BACKOFF if base is None else base
    delay: float = min(float(settings.RETRY_BACKOFF_MAX), first * 2 ** max(attempts - 1, 0))
    jitter = float(settings.RETRY_JITTER)
    return max(0.0, delay * random.uniform(1 - jitter, 1 + jitter))


class JobQuerySet(models.QuerySet["Job"]):
    def runnable(
        self, queues: Sequence[str] | None = None, now: datetime | None = None
    ) -> JobQuerySet:
        qs = self.filter(status=QUEUED, run_after__lte=now or timezone.now())
        if queues:
            qs = qs.filter(queue__in=list(queues))
        return qs.order_by(*CLAIM_ORDER)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=[DONE, FAILED, CANCELLED])

    # -- operator actions (the admin calls these) ----------------------------------------
    # Each write is guarded by status, so a job that changed state meanwhile (a worker
    # claimed it, finished it) is left alone instead of being overwritten. On MySQL an
    # UPDATE locks every index record it scans: call these on querysets filtered by
    # primary key (the admin works through large selections in chunks of ids).

    def requeue(self, run_now: bool = False) -> int:
        """Put failed, cancelled and done jobs back in the queue with a fresh attempt count.

        ``last_error`` and the ``errors`` history are kept so the operator can still see
        why the job failed before. ``unique_key`` stays empty: the key was released when
        the job finished. Returns how many jobs were requeued.
        """
        fields: dict[str, Any] = {
            "status": QUEUED,
            "attempts": 0,
            "owner": "",
            "owner_date": None,
            "cancel_requested": False,
            "result": None,
            "started_at": None,
            "finished_at": None,
        }
        if run_now:
            fields["run_after"] = timezone.now()
        return self.filter(status__in=[FAILED, CANCELLED, DONE]).update(**fields)

    def cancel(self) -> tuple[int, int]:
        """Cancel queued jobs and ask the workers running claimed ones to stop.

        Returns ``(cancelled, asked_to_stop)``. A claimed job is only flagged
        (``cancel_requested``): its worker stops it and records it cancelled. The rows are
        locked first so none moves between "queued" and "claimed" between the two writes
        (a job retried back to the queue in between would otherwise escape both).
        """
        now = timezone.now()
        locked = self.select_for_update().filter(status__in=[QUEUED, CLAIMED])
        with claim_transaction(locked.db):  # select_for_update() routes it for writing
            list(locked.values_list("id", flat=True))
            active = self.using(locked.db).filter(status__in=[QUEUED, CLAIMED])
            cancelled = active.filter(status=QUEUED).update(
                status=CANCELLED, finished_at=now, unique_key=None, owner_date=None
            )
            asked = active.filter(status=CLAIMED).update(cancel_requested=True)
        return cancelled, asked

    def run_now(self) -> int:
        """Make queued jobs runnable at once (their ``run_after`` becomes now)."""
        return self.filter(status=QUEUED).update(run_after=timezone.now())

    def delete_unclaimed(self) -> int:
        """Delete these jobs except those a worker is running (cancel those first).

        Returns how many rows were deleted.
        """
        deleted, _ = self.exclude(status=CLAIMED).delete()
        return deleted


class JobManager(models.Manager["Job"]):
    def get_queryset(self) -> JobQuerySet:
        return JobQuerySet(self.model, using=self._db)

    def runnable(self, queues: Sequence[str] | None = None) -> JobQuerySet:
        return self.get_queryset().runnable(queues)

    def _using(self) -> str:
        return self._db or router.db_for_write(self.model)

    def claim(
        self, owner: str, batch_size: int = 100, queues: Sequence[str] | None = None
    ) -> list[Job]:
        """Claim up to ``batch_size`` runnable jobs for ``owner`` in one short transaction.

        1. read candidate ids (plain read, the claim index in order),
        2. lock those ids skipping rows another claimer holds, re-checking the status,
        3. one UPDATE by primary key, 4. COMMIT.
        Attempts are counted here, so a job that kills its worker still uses one up.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        using = self._using()
        vendor = connections[using].vendor
        for _ in range(3):
            now = timezone.now()
            with claim_transaction(using):
                qs = self.get_queryset().using(using)
                candidates = list(
                    qs.runnable(queues, now).values_list("id", flat=True)[:batch_size]
                )
                if not candidates:
                    return []
                if vendor == "sqlite":
                    # The IMMEDIATE transaction already excludes every other writer.
                    jobs = list(qs.filter(id__in=candidates).order_by(*CLAIM_ORDER))
                else:
                    jobs = list(
                        qs.select_for_update(skip_locked=True)
                        .filter(id__in=candidates, status=QUEUED)
                        .order_by(*CLAIM_ORDER)
                    )
                if jobs:
                    ids = [job.id for job in jobs]
                    qs.filter(id__in=ids).update(
                        status=CLAIMED, owner=owner, owner_date=now, attempts=F("attempts") + 1
                    )
                    for job in jobs:
                        job.status, job.owner, job.owner_date = CLAIMED, owner, now
                        job.attempts += 1
                    return jobs
            # Every candidate was taken by another claimer between our read and our lock:
            # read again at once, the queue is evidently busy.
        return []

    # -- finishing ---------------------------------------------------------------------

    def _owned(self, owner: str) -> JobQuerySet:
        # The guard that makes finishing exactly-once: only the current owner of a
        # claimed job may finish it, and a second identical write matches nothing.
        return self.get_queryset().using(self._using()).filter(status=CLAIMED, owner=owner)

    def finish_done(self, owner: str, jobs: Sequence[Job]) -> set[int]:
        """Record jobs as DONE; returns the ids this owner actually finished."""
        if not jobs:
            return set()
        now = timezone.now()
        plain = [j for j in jobs if j.result is None]
        with_result = [j for j in jobs if j.result is not None]
        updated: set[int] = set()
        with transaction.atomic(using=self._using()):
            if plain:
                ids = [j.id for j in plain]
                lost = self._lost(owner, ids)
                keep = [i for i in ids if i not in lost]
                if keep:
                    self._owned(owner).filter(id__in=keep).update(
                        status=DONE, finished_at=now, unique_key=None, cancel_requested=False
                    )
                updated.update(keep)
            if with_result:
                ids = [j.id for j in with_result]
                lost = self._lost(owner, ids)
                keep_jobs = [j for j in with_result if j.id not in lost]
                for job in keep_jobs:
                    job.status, job.finished_at, job.unique_key = DONE, now, None
                if keep_jobs:
                    self._owned(owner).bulk_update(
                        keep_jobs, ["status", "finished_at", "unique_key", "result"]
                    )
                updated.update(j.id for j in keep_jobs)
        started = [j for j in jobs if j.id in updated and j.started_at is not None]
        self._set_started(started)
        return updated

    def _set_started(self, jobs: Sequence[Job]) -> None:
        # started_at is informational; written with the finish, not as an extra round trip
        # per job before it runs.
        if jobs:
            self.get_queryset().using(self._using()).bulk_update(list(jobs), ["started_at"])

    def _lost(self, owner: str, ids: Iterable[int]) -> set[int]:
        """Ids among ``ids`` that are no longer claimed by ``owner``."""
        ids = list(ids)
        owned = set(self._owned(owner).filter(id__in=ids).values_list("id", flat=True))
        return {i for i in ids if i not in owned}

    def finish_failed_attempt(
        self, owner: str, job: Job, error: str, error_class: str
    ) -> str | None:
        """Record a failed attempt: back to QUEUED with backoff, or FAILED when spent.

        Returns the new status, or None when the job was no longer ours to finish.
        """
        now = timezone.now()
        errors = list(job.errors or [])
        errors.append(
            {"exception_class_path": error_class, "traceback": error, "at": now.isoformat()}
        )
        errors = errors[-int(settings.KEEP_ERRORS) :]
        fields: dict[str, Any] = {"last_error": error, "errors": errors, "cancel_requested": False}
        if job.started_at is not None:
            fields["started_at"] = job.started_at
        if job.attempts >= job.max_attempts:
            fields.update(status=FAILED, finished_at=now, unique_key=None)
        else:
            delay = retry_delay(job.attempts, job.retry_backoff)
            fields.update(status=QUEUED, run_after=now + timedelta(seconds=delay), owner_date=None)
        if not self._owned(owner).filter(id=job.id).update(**fields):
            return None
        for name, value in fields.items():
            setattr(job, name, value)
        return str(fields["status"])

    def give_back(self, owner: str, ids: Sequence[int]) -> int:
        """Return claimed jobs that never started: runnable at once, attempt not counted."""
        if not ids:
            return 0
        return (
            self._owned(owner)
            .filter(id__in=list(ids))
            .update(status=QUEUED, owner_date=None, attempts=F("attempts") - 1)
        )

    def cancel_claimed(self, owner: str, job: Job, reason: str) -> bool:
        now = timezone.now()
        return bool(
            self._owned(owner)
            .filter(id=job.id)
            .update(status=CANCELLED, finished_at=now, unique_key=None, last_error=reason)
        )

    # -- leases ------------------------------------------------------------------------

    def renew_leases(self, owner: str) -> int:
        """Heartbeat: keep every job this owner holds from being recovered."""
        return self._owned(owner).update(owner_date=timezone.now())

    def cancel_requested_ids(self, owner: str, ids: Sequence[int]) -> set[int]:
        return set(
            self._owned(owner)
            .filter(id__in=list(ids), cancel_requested=True)
            .values_list("id", flat=True)
        )

    def recover_expired(self, lease_timeout: float | None = None) -> tuple[int, int]:
        """Requeue (or fail, when attempts are spent) jobs whose owner stopped renewing.

        Returns (requeued, failed).
        """
        lease = float(settings.LEASE_TIMEOUT if lease_timeout is None else lease_timeout)
        now = timezone.now()
        cutoff = now - timedelta(seconds=lease)
        qs = self.get_queryset().using(self._using())
        expired = qs.filter(status=CLAIMED, owner_date__lt=cutoff)
        requeued = failed = 0
        with claim_transaction(self._using()):
            rows = list(
                expired.select_for_update(skip_locked=True).values_list(
                    "id", "owner", "attempts", "max_attempts"
                )[:1000]
            )
            for job_id, owner, attempts, max_attempts in rows:
                message = (
                    f"Recovered at {now.isoformat()}: worker {owner} stopped renewing its "
                    f"lease (attempt {attempts} of {max_attempts} counted)."
                )
                guard = qs.filter(id=job_id, status=CLAIMED, owner=owner, owner_date__lt=cutoff)
                if attempts >= max_attempts:
                    failed += guard.update(
                        status=FAILED, finished_at=now, unique_key=None, last_error=message
                    )
                else:
                    requeued += guard.update(
                        status=QUEUED, owner_date=None, run_after=now, last_error=message
                    )
        return requeued, failed
