"""``Job.objects``: the queryset's operator actions plus the worker's state changes.

Each method is a thin door into the module that owns the SQL of one state change
(:mod:`.claim`, :mod:`.finish`, :mod:`.leases`, :mod:`.insert`); it only picks the
database alias.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import models, router

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.queue import claim, finish, insert, leases
from django_dbqueue.queue.actions import JobQuerySet
from django_dbqueue.queue.shares import Owner

if TYPE_CHECKING:
    from django_dbqueue.models import Job


class BaseJobManager(models.Manager["Job"]):
    def _using(self) -> str:
        return self._db or router.db_for_write(self.model)

    def primary(self) -> JobQuerySet:
        """The jobs as the database the router writes them to has them: for every read
        that decides something (a replica that lags would answer with the past)."""
        return self.get_queryset().using(self._using())  # type: ignore[return-value]

    def claim(
        self, owner: Owner, batch_size: int = 100, queues: Sequence[str] | None = None
    ) -> claim.Claimed:
        """Claim up to ``batch_size`` runnable jobs for ``owner`` (see :mod:`.claim`).
        Given :class:`~.shares.Shares` (a host's claimer, worker/handout.py), each worker
        sends ``jobs_claimed`` for its own share when it receives it."""
        jobs = claim.claim(
            self.model, self._using(), owner, batch_size, list(queues or settings.QUEUES)
        )
        if isinstance(owner, str):
            signals.jobs_claimed.send(self.model, jobs=jobs, worker=owner)
        return jobs

    def insert_many(self, jobs: Sequence[Job], batch_size: int = 1000) -> list[Job]:
        return insert.insert_many(self.model, self._using(), jobs, batch_size)

    def finish_done(self, owner: str, jobs: Sequence[Job]) -> set[int]:
        return finish.finish_done(self.model, self._using(), owner, jobs)

    def finish_failed_attempt(
        self, owner: str, job: Job, error: str, error_class: str
    ) -> str | None:
        return finish.finish_failed_attempt(
            self.model, self._using(), owner, job, error, error_class
        )

    def give_back(self, owner: str, ids: Sequence[int]) -> int:
        return finish.give_back(self.model, self._using(), owner, ids)

    def give_back_suspect(self, owner: str, job: Job, error: str, error_class: str) -> bool:
        return finish.give_back_suspect(self.model, self._using(), owner, job, error, error_class)

    def cancel_claimed(self, owner: str, job: Job, reason: str) -> bool:
        return finish.cancel_claimed(self.model, self._using(), owner, job, reason)

    def retry_later(self, owner: str, job: Job, delay: float, reason: str) -> bool:
        return finish.retry_later(self.model, self._using(), owner, job, delay, reason)

    def renew_leases(self, owner: str, ids: Sequence[int]) -> int:
        return leases.renew_leases(self.model, self._using(), owner, ids)

    def note_running(self, owner: str, job_id: int, started: datetime) -> int:
        return leases.note_running(self.model, self._using(), owner, job_id, started)

    def cancel_requested_ids(self, owner: str, ids: Sequence[int]) -> set[int]:
        return leases.cancel_requested_ids(self.model, self._using(), owner, ids)

    def recover_expired(self, lease_timeout: float | None = None) -> tuple[int, int]:
        return leases.recover_expired(self.model, self._using(), lease_timeout)


# Job.objects.requeue() etc. work on the whole table as on any queryset.
JobManager = BaseJobManager.from_queryset(JobQuerySet)
