"""What operators do to jobs (the admin calls these): requeue, cancel, run now, delete.

Each write is guarded by status, so a job that changed state meanwhile (a worker claimed
it, finished it) is left alone instead of being overwritten. On MySQL an UPDATE locks
every index record it scans: call these on querysets filtered by primary key (the admin
works through large selections in chunks of ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone

from django_dbqueue.queue.claim import CLAIM_ORDER
from django_dbqueue.queue.dialects import write_transaction
from django_dbqueue.status import CANCELLED, CLAIMED, DONE, FAILED, FINISHED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job  # noqa: F401 (named in the base class below)


class JobQuerySet(models.QuerySet["Job"]):
    def runnable(
        self, queues: Sequence[str] | None = None, now: datetime | None = None
    ) -> JobQuerySet:
        qs = self.filter(status=QUEUED, run_after__lte=now or timezone.now())
        if queues:
            qs = qs.filter(queue__in=list(queues))
        return qs.order_by(*CLAIM_ORDER)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=FINISHED)

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
        with write_transaction(locked.db):  # select_for_update() routes it for writing
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
