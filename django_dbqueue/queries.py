"""The SQL of the queue: claiming, finishing, renewing leases and recovery.

Every write here goes by primary key or by the indexes declared on ``Job``; every
transaction is short and never spans a job's execution. Database differences live in
:func:`claim_transaction` and nowhere else.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from django_dbqueue.conf import settings

if TYPE_CHECKING:
    from django_dbqueue.models import Job

QUEUED, CLAIMED, DONE, FAILED, CANCELLED = "queued", "claimed", "done", "failed", "cancelled"
CLAIM_ORDER = ("-priority", "run_after", "id")


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    """A short read-then-write transaction suited to this database.

    SQLite has no ``SELECT ... FOR UPDATE``: the transaction takes the write lock at
    BEGIN (IMMEDIATE), so two writers queue on the busy timeout instead of both
    reading and one failing at once ("database is locked") when it upgrades its lock.
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
            with write_transaction(using):
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
        """Record jobs as DONE in one UPDATE; returns the ids this owner actually finished.

        Jobs another worker took over meanwhile (our lease ran out) are left alone.
        """
        if not jobs:
            return set()
        now = timezone.now()
        using = self._using()
        with write_transaction(using):
            owned = self._owned(owner).filter(id__in=[j.id for j in jobs])
            if connections[using].vendor != "sqlite":
                owned = owned.select_for_update()
            ids = set(owned.values_list("id", flat=True))
            keep = [j for j in jobs if j.id in ids]
            if not keep:
                return set()
            fields: dict[str, Any] = {"status": DONE, "finished_at": now, "unique_key": None}
            started = [When(id=j.id, then=Value(j.started_at)) for j in keep if j.started_at]
            if started:
                fields["started_at"] = Case(
                    *started, default=F("started_at"), output_field=models.DateTimeField()
                )
            results = [
                When(id=j.id, then=Value(j.result, output_field=models.JSONField()))
                for j in keep
                if j.result is not None
            ]
            if results:
                fields["result"] = Case(
                    *results, default=F("result"), output_field=models.JSONField()
                )
            self._owned(owner).filter(id__in=ids).update(**fields)
        for job in keep:
            job.status, job.finished_at, job.unique_key = DONE, now, None
        return ids

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

    def renew_leases(self, owner: str, ids: Sequence[int]) -> int:
        """Heartbeat: keep the jobs this owner knows it holds from being recovered."""
        if not ids:
            return 0
        return self._owned(owner).filter(id__in=list(ids)).update(owner_date=timezone.now())

    def retry_later(self, owner: str, job: Job, delay: float, reason: str) -> bool:
        """The job asked to run again later (RetryJob): requeue it, attempt not counted."""
        run_after = timezone.now() + timedelta(seconds=delay)
        updated = (
            self._owned(owner)
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
        with write_transaction(self._using()):
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
