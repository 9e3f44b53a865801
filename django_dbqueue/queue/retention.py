"""Retention: deleting finished jobs once they are old enough, in short statements.

Each batch reads up to ``PRUNE_BATCH_SIZE`` ids along the history index
(``dbq_job_finished``, through ``JobQuerySet.finished_with``) and deletes them by
primary key, so no DELETE scans a range or holds its locks for long
(InnoDB locks every index record a DELETE reads). Workers prune at most once per
``RETENTION_INTERVAL`` across the whole cluster: a :class:`~django_dbqueue.models.Duty`
row whose ``due_at`` only one of them can move forward. (The scheduling room's old ticks
go in the same turn: worker/duties.py prunes them when :func:`prune_if_due` ran.)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, router, transaction

from django_dbqueue.conf import settings
from django_dbqueue.models import Dependency, Duty, Job
from django_dbqueue.queue import clock
from django_dbqueue.queue.batches import prune_completed
from django_dbqueue.queue.concurrency import prune_keys
from django_dbqueue.status import CANCELLED, DONE, FAILED

# Done jobs are most of the table and what an operator needs least: a day is enough to
# look at today's work (Solid Queue keeps finished jobs a day too). Failed jobs wait for a
# person to read them, over a weekend or a holiday. Cancelled ones were an operator's choice.
DEFAULT_RETENTION: dict[str, timedelta | None] = {
    DONE: timedelta(days=1),
    FAILED: timedelta(days=30),
    CANCELLED: timedelta(days=7),
}
PRUNE_DUTY = "prune"
logger = logging.getLogger("django_dbqueue.retention")


def as_timedelta(value: object, what: str) -> timedelta | None:
    """``None``, a timedelta or seconds -> timedelta (or None: keep forever)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"{what} must be seconds, a timedelta or None, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > 100 * 365 * 86400:
        raise ValueError(f"{what} must be between 0 and 100 years, not {value!r}")
    return timedelta(seconds=seconds)


def retention_policy() -> dict[str, timedelta | None]:
    """``DBQUEUE['RETENTION']`` over :data:`DEFAULT_RETENTION`; raises ValueError if bad."""
    configured = settings.RETENTION
    if not isinstance(configured, dict):
        raise ValueError("DBQUEUE['RETENTION'] must be a dict like {'done': 86400}")
    unknown = set(configured) - set(DEFAULT_RETENTION)
    if unknown:
        raise ValueError(
            f"DBQUEUE['RETENTION'] has unknown key(s) {', '.join(sorted(unknown))}; "
            f"the keys are {', '.join(DEFAULT_RETENTION)}"
        )
    policy = dict(DEFAULT_RETENTION)
    for status, value in configured.items():
        policy[status] = as_timedelta(value, f"DBQUEUE['RETENTION'][{status!r}]")
    return policy


@dataclass
class Cutoff:
    status: str
    before: datetime


def cutoffs(
    policy: dict[str, timedelta | None], now: datetime, statuses: Iterable[str] | None = None
) -> list[Cutoff]:
    wanted = set(statuses) if statuses is not None else set(policy)
    return [
        Cutoff(status, now - age)
        for status, age in policy.items()
        if age is not None and status in wanted
    ]


def prunable(cutoff: Cutoff) -> int:
    """How many rows a prune would delete (a plain count: for --dry-run and the admin)."""
    using = router.db_for_write(Job)
    return (
        Job.objects.using(using)
        .finished_with(cutoff.status)
        .filter(finished_at__lt=cutoff.before)
        .order_by()
        .count()
    )


def prune(
    targets: list[Cutoff],
    batch_size: int | None = None,
    max_seconds: float | None = None,
    on_batch: Callable[[str, int], None] | None = None,
    pause: float = 0.0,
) -> tuple[int, bool]:
    """Delete finished jobs older than their cutoff, a batch of ids at a time.

    Stops after ``max_seconds`` (when given) so a worker's turn stays short; what is left
    goes in the next run. After each batch it sleeps ``pause`` times as long as the batch
    took, leaving the database to the drain in between. Returns (rows deleted, whether
    everything due was deleted).
    """
    size = int(batch_size or settings.PRUNE_BATCH_SIZE)
    if size < 1:
        raise ValueError("batch_size must be at least 1")
    using = router.db_for_write(Job)
    jobs = Job.objects.using(using)
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    deleted = 0
    for cutoff in targets:
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                return deleted, False
            batch_started = time.monotonic()
            ids = list(
                jobs.finished_with(cutoff.status)
                .filter(finished_at__lt=cutoff.before)
                .order_by("finished_at", "id")
                .values_list("id", flat=True)[:size]
            )
            if not ids:
                break
            # By primary key, re-checking the status: a job requeued since we read it stays.
            count, _ = jobs.filter(id__in=ids, status=cutoff.status).delete()
            _forget_edges(using, ids)
            deleted += count
            if on_batch is not None:
                on_batch(cutoff.status, count)
            if len(ids) < size:
                break
            if pause:
                time.sleep(pause * (time.monotonic() - batch_started))
    return deleted, _prune_batches(using, targets, size, deadline)


def _prune_batches(using: str, targets: list[Cutoff], size: int, deadline: float | None) -> bool:
    """The batches completed before every status's cutoff (kept as long as the longest
    kept of their members; not at all when a status is kept forever or not pruned by
    this run), with their counter rows. Whether everything due was deleted."""
    if {target.status for target in targets} != set(DEFAULT_RETENTION):
        return True
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        return False
    before = min(target.before for target in targets)
    count = prune_completed(using, before, size, left)
    if count:
        logger.debug("Retention: deleted %s completed batch(es)", count)
    return deadline is None or time.monotonic() < deadline


def _forget_edges(using: str, ids: list[int]) -> None:
    """The dependency rows of pruned jobs (docs/workflows.md): a finished job's edges
    served its wait and its results; those of a job that stayed (requeued) are kept."""
    edges = Dependency.objects.using(using)
    kept = Job.objects.using(using).filter(id__in=ids).values("id")
    edges.filter(job_id__in=ids).exclude(job_id__in=kept).delete()


def claim_duty(name: str, interval: float, now: datetime | None = None) -> bool:
    """True for exactly one caller per ``interval`` seconds across the cluster."""
    using = router.db_for_write(Duty)
    now = now or clock.now(using, fresh=True)
    duties = Duty.objects.using(using)
    next_due = now + timedelta(seconds=interval)
    if duties.filter(name=name, due_at__lte=now).update(due_at=next_due, last_run_at=now):
        return True
    if duties.filter(name=name).exists():
        return False
    try:
        with transaction.atomic(using=using):
            duties.create(name=name, due_at=next_due, last_run_at=now)
    except IntegrityError:
        return False  # another worker created it first: its turn
    return True


def _log_batch(status: str, count: int) -> None:
    logger.debug(
        "Retention: one DELETE removed %s %s job(s)",
        count,
        status,
        extra={"event": "prune_batch", "status": status, "rows": count},
    )


# In a worker's turn, each DELETE is followed by a pause three times as long as it took:
# the turn spends at most a quarter of its time deleting, and the drain beside it keeps
# the database (SQLite's single write lock above all; see docs/benchmarks.md).
TURN_PAUSE = 3.0


# A run that ran out of time comes back this soon (not a whole interval later), so a
# backlog of old rows is worked off in short turns instead of never catching up.
BACKLOG_RETRY = 5.0


def prune_if_due(max_seconds: float = 0.5) -> int | None:
    """The workers' share of retention: prune for up to ``max_seconds`` when it is this
    worker's turn (once per ``RETENTION_INTERVAL`` across the cluster); None otherwise."""
    now = clock.now(router.db_for_write(Duty), fresh=True)
    interval = float(settings.RETENTION_INTERVAL)
    if not claim_duty(PRUNE_DUTY, interval, now):
        return None
    started = time.monotonic()
    deleted, complete = prune(
        cutoffs(retention_policy(), now),
        max_seconds=max_seconds,
        on_batch=_log_batch,
        pause=TURN_PAUSE,
    )
    # Concurrency keys no waiting or running job uses, in what is left of the turn.
    left = max(0.0, max_seconds - (time.monotonic() - started))
    if complete and left > 0:
        prune_keys(router.db_for_write(Job), int(settings.PRUNE_BATCH_SIZE), max_seconds=left)
    using = router.db_for_write(Duty)
    update: dict[str, object] = {"last_result": f"deleted {deleted}"}
    if not complete:
        update["due_at"] = clock.now(using) + timedelta(seconds=min(interval, BACKLOG_RETRY))
    Duty.objects.using(using).filter(name=PRUNE_DUTY).update(**update)
    return deleted
