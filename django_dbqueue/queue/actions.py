"""What operators do to jobs (the admin calls these): requeue, cancel, run now, delete.

Each write is guarded by status, so a job that changed state meanwhile (a worker claimed
it, finished it) is left alone instead of being overwritten. On MySQL an UPDATE locks
every index record it scans: call these on querysets filtered by primary key (the admin
works through large selections in chunks of ids). Each statement (or short transaction)
is retried through deadlocks and lock wait timeouts (queue/conflicts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Case, F, Value, When

from django_dbqueue.queue import clock
from django_dbqueue.queue.claim import CLAIM_ORDER
from django_dbqueue.queue.concurrency import PARKED_UNTIL
from django_dbqueue.queue.conflicts import retry_conflicts
from django_dbqueue.queue.dialects import dialect, write_transaction
from django_dbqueue.queue.ends import settle
from django_dbqueue.status import CANCELLED, CLAIMED, DONE, FAILED, FINISHED, QUEUED, WAITING

if TYPE_CHECKING:
    from django_dbqueue.models import Job  # noqa: F401 (named in the base class below)


@dataclass
class RequeueReport:
    requeued: int = 0
    # (job id, its unique key, the id of the job holding that key, None if it finished
    # in between) for each job left alone because its key was taken.
    key_held: list[tuple[int, str, int | None]] = field(default_factory=list)

    def describe(self) -> str:
        """One sentence naming the jobs a requeue left alone, for the admin."""
        parts = [
            f"#{pk} ({key!r}, held by job #{holder})"
            if holder is not None
            else f"#{pk} ({key!r}, taken meanwhile)"
            for pk, key, holder in self.key_held[:20]
        ]
        more = len(self.key_held) - len(parts)
        tail = f" and {more} more" if more > 0 else ""
        return (
            f"{len(self.key_held)} job(s) not requeued because another job holds their "
            f"unique key: {', '.join(parts)}{tail}."
        )


_Q = TypeVar("_Q", bound=models.QuerySet[Any])


def finished_with(queryset: _Q, status: str) -> _Q:
    """The jobs of ``queryset`` that finished as ``status``, asked so the history index
    ``dbq_job_finished`` answers.

    Every reader of finished jobs (pruning, "failed since", history, recent failures)
    goes through here. PostgreSQL's index is partial, ``WHERE finished_at IS NOT NULL``
    (migration 0008): the condition says the row is in it. On MySQL/MariaDB it is on the
    virtual column ``finished_status`` (migration 0009): see ``MySQL.finished_with`` in
    ``dialects/mysql.py``.
    """
    return dialect(connections[queryset.db]).finished_with(queryset, status)


class JobQuerySet(models.QuerySet["Job"]):
    def runnable(
        self, queues: Sequence[str] | None = None, now: datetime | None = None
    ) -> JobQuerySet:
        qs = self.filter(status=QUEUED, run_after__lte=now or clock.now(self._write_db()))
        if queues:
            qs = qs.filter(queue__in=list(queues))
        return qs.order_by(*CLAIM_ORDER)

    def finished_with(self, status: str) -> JobQuerySet:
        """The jobs that finished as ``status``, asked so the history index answers
        (:func:`finished_with`)."""
        return finished_with(self, status)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=FINISHED)

    def _write_db(self) -> str:
        """The database these rows are written on (``db`` names the read one until a
        write starts), known before the write: the retry needs it to see a transaction."""
        explicit: str | None = getattr(self, "_db", None)
        return explicit or router.db_for_write(self.model, **getattr(self, "_hints", {}))

    def requeue(self, run_now: bool = False) -> int:
        """Put failed, cancelled and done jobs back in the queue; returns how many.

        See :meth:`requeue_report`, which also says which jobs were left alone because
        another job holds their unique key.
        """
        return self.requeue_report(run_now).requeued

    def requeue_report(self, run_now: bool = False) -> RequeueReport:
        """Put failed, cancelled and done jobs back in the queue with a fresh attempt count.

        ``last_error`` and the ``errors`` history are kept so the operator can still see
        why the job failed before. A job enqueued with a ``unique_key`` gets its key back;
        when another job holds that key (a newer job of the same key waits or runs), the
        job is not requeued, as ``enqueue()`` would not have added it either, and the
        report names it and the holder.
        """
        fields: dict[str, Any] = {
            "status": QUEUED,
            "attempts": 0,
            "owner": "",
            "owner_date": None,
            "cancel_requested": False,
            "result": None,
            "started_at": None,
            "last_attempted_at": None,
            "finished_at": None,
        }
        now = clock.now(self._write_db())
        # A job cancelled while parked over its key's limit still has run_after in year
        # 9000, and no key flag would ever release it: it runs now (the claim parks it
        # again if its key is full).
        fields["run_after"] = (
            now
            if run_now
            else Case(When(run_after__gte=PARKED_UNTIL, then=Value(now)), default=F("run_after"))
        )
        using = self._write_db()
        requeueable = self.using(using).filter(status__in=[FAILED, CANCELLED, DONE])
        unkeyed = requeueable.filter(origin_unique_key=None)
        report = RequeueReport(
            requeued=retry_conflicts(using, "requeue", lambda: unkeyed.update(**fields))
        )
        keyed = requeueable.exclude(origin_unique_key=None).order_by("pk")
        for pk, key in keyed.values_list("pk", "origin_unique_key"):
            one = self.model._default_manager.using(using).filter(
                pk=pk, status__in=[FAILED, CANCELLED, DONE]
            )

            def requeue_one(one: Any = one, key: str | None = key) -> int:
                # A savepoint: on PostgreSQL a failed statement spoils the transaction.
                with transaction.atomic(using=using):
                    return int(one.update(unique_key=key, **fields))

            try:
                changed = retry_conflicts(using, "requeue", requeue_one)
            except IntegrityError:
                holder = (
                    self.model._default_manager.using(using)
                    .filter(unique_key=key)
                    .values_list("pk", flat=True)
                    .first()
                )
                report.key_held.append((pk, str(key), holder))
                continue
            report.requeued += changed
        return report

    def cancel(self) -> tuple[int, int]:
        """Cancel queued jobs and ask the workers running claimed ones to stop.

        Returns ``(cancelled, asked_to_stop)``. A claimed job is only flagged
        (``cancel_requested``): its worker stops it and records it cancelled. The rows are
        locked first so none moves between "queued" and "claimed" between the two writes
        (a job retried back to the queue in between would otherwise escape both).
        """
        locked = self.select_for_update().filter(status__in=[QUEUED, WAITING, CLAIMED])
        now = clock.now(locked.db)

        def cancel_locked() -> tuple[int, int]:
            with write_transaction(locked.db):  # select_for_update() routes it for writing
                rows = dict(locked.values_list("id", "status"))
                active = self.using(locked.db).filter(id__in=list(rows))
                idle = [job_id for job_id, status in rows.items() if status != CLAIMED]
                cancelled = active.filter(id__in=idle, status__in=[QUEUED, WAITING]).update(
                    status=CANCELLED, finished_at=now, unique_key=None, owner_date=None
                )
                # Their dependents follow; their batches count them (docs/workflows.md).
                settle(self.model, locked.db, dict.fromkeys(idle, CANCELLED))
                asked = active.filter(status=CLAIMED).update(cancel_requested=True)
            return cancelled, asked

        return retry_conflicts(locked.db, "cancel", cancel_locked)

    def run_now(self) -> int:
        """Make queued jobs runnable at once (their ``run_after`` becomes now)."""
        queued = self.using(self._write_db()).filter(status=QUEUED)
        return retry_conflicts(
            queued.db, "run now", lambda: queued.update(run_after=clock.now(queued.db))
        )

    def delete_unclaimed(self) -> int:
        """Delete these jobs except those a worker is running (cancel those first).

        Returns how many rows were deleted.
        """
        unclaimed = self.using(self._write_db()).exclude(status=CLAIMED)
        deleted, _ = retry_conflicts(unclaimed.db, "delete", unclaimed.delete)
        return deleted
