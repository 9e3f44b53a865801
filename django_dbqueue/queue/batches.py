"""A batch's members counted as they end, and its callbacks enqueued exactly once
(docs/workflows.md).

A member's end is counted in the transaction that records it: its row's
``batch_counted`` goes from false to true in the finishing UPDATE (so an operator's
requeue never counts it twice) and one :class:`~django_dbqueue.models.BatchCounter`
shard, picked at random per transaction, moves by the members it ended. Concurrent
finishes of one batch spread over the shards instead of queueing on one hot row.
Whether the batch is complete is read after the commit (:func:`complete`), by whoever
counted, and by the sweep: the callbacks are inserted by the one transaction whose
conditional UPDATE sets ``completed_at``.
"""

from __future__ import annotations

import random
import time
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import transaction
from django.db.models import F, OuterRef, Subquery, Sum

from django_dbqueue.queue import announce, clock
from django_dbqueue.queue.dialects import write_transaction
from django_dbqueue.status import CANCELLED, DONE, FAILED, FINISHED

if TYPE_CHECKING:
    from django_dbqueue.models import Job

SHARDS = 16
COLUMN = {DONE: "done", FAILED: "failed", CANCELLED: "cancelled"}
CALLBACKS = ("on_complete", "on_success", "on_failure")


def _batches() -> Any:
    return apps.get_model("django_dbqueue", "Batch")


def _counters() -> Any:
    return apps.get_model("django_dbqueue", "BatchCounter")


def create(using: str, callbacks: Mapping[str, Any], closed: bool) -> Any:
    """A new batch with its counter shards, in the caller's transaction."""
    batch = _batches().objects.using(using).create(callbacks=dict(callbacks), closed=closed)
    _counters().objects.using(using).bulk_create(
        [_counters()(batch_id=batch.id, shard=shard) for shard in range(SHARDS)]
    )
    return batch


def add_members(model: type[Job], using: str, batch_id: int, ids: list[int]) -> bool:
    """Make jobs ``ids`` (just inserted by the caller) members of an open batch; False
    (nothing written) when the batch is closed or gone."""
    grown = (
        _batches()
        .objects.using(using)
        .filter(id=batch_id, closed=False)
        .update(total=F("total") + len(ids))
    )
    if not grown:
        return False
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        model.objects.using(using).filter(id__in=chunk).update(batch_id=batch_id, workflow=True)
    return True


def close(using: str, batch_id: int) -> bool:
    """No more members; its completion is looked at once the caller commits."""
    closed = _batches().objects.using(using).filter(id=batch_id).update(closed=True)
    transaction.on_commit(lambda: complete(using, [batch_id]), using=using)
    return bool(closed)


def count(model: type[Job], using: str, ends: Mapping[int, str]) -> set[int]:
    """Count the ends of members among ``ends`` (id -> final status), in the caller's
    transaction; returns their batches (to :func:`complete` after the commit)."""
    if not ends:
        return set()
    jobs = model.objects.using(using)
    rows = jobs.filter(id__in=list(ends), batch_id__isnull=False, batch_counted=False)
    members = [(job_id, int(b)) for job_id, b in rows.values_list("id", "batch_id") if b]
    if not members:
        return set()
    jobs.filter(id__in=[m[0] for m in members]).update(batch_counted=True)
    return add_counts(using, members, ends)


def add_counts(using: str, members: list[tuple[int, int]], ends: Mapping[int, str]) -> set[int]:
    """Move a counter shard for ``members`` ((job id, batch id), already marked
    ``batch_counted``): one row write per batch and transaction, however many members
    it ends. Returns their batches."""
    # One shard per transaction, at random: a flush of many members writes one row per
    # batch, and concurrent finishers mostly write different rows.
    shard = random.randrange(SHARDS)
    moves: dict[tuple[int, int], Tally[str]] = defaultdict(Tally)
    for job_id, batch_id in members:
        moves[(batch_id, shard)][COLUMN[ends[job_id]]] += 1
    for (batch_id, shard), tally in sorted(moves.items()):
        _counters().objects.using(using).filter(batch_id=batch_id, shard=shard).update(
            **{name: F(name) + n for name, n in tally.items()}
        )
    return {batch_id for _, batch_id in members}


def after_commit(using: str, batch_ids: Iterable[int]) -> None:
    """Look at the batches once the caller's transaction commits."""
    ids = sorted(set(batch_ids))
    if ids:
        transaction.on_commit(lambda: complete(using, ids), using=using)


def totals(using: str, batch_id: int) -> dict[str, int]:
    """The batch's counts of ended members (done, failed, cancelled)."""
    sums = (
        _counters()
        .objects.using(using)
        .filter(batch_id=batch_id)
        .aggregate(**{name: Sum(name) for name in COLUMN.values()})
    )
    return {name: int(value or 0) for name, value in sums.items()}


def complete(using: str, batch_ids: Iterable[int], missing: int = 0) -> list[int]:
    """Complete the closed batches of ``batch_ids`` whose members have all ended: the one
    call whose conditional UPDATE sets ``completed_at`` enqueues the callbacks, in its
    transaction. ``missing``: members known deleted before they ended (the sweep),
    counted as cancelled. Returns the batches completed by this call."""
    completed = []
    batches = _batches().objects.using(using)
    for batch_id in batch_ids:
        # One read: the batch's total and its shards' sums (closed, not completed yet).
        shards = _counters().objects.filter(batch_id=OuterRef("pk")).order_by()
        sums = {
            f"{name}_sum": Subquery(shards.values("batch_id").annotate(v=Sum(name)).values("v"))
            for name in COLUMN.values()
        }
        row = (
            batches.filter(id=batch_id, closed=True, completed_at__isnull=True)
            .annotate(**sums)
            .values_list("total", *sums)
            .first()
        )
        if row is None:
            continue
        counts = {
            name: int(value or 0) for name, value in zip(COLUMN.values(), row[1:], strict=True)
        }
        counts["cancelled"] += missing
        if sum(counts.values()) < row[0]:
            continue
        with write_transaction(using):
            won = batches.filter(id=batch_id, closed=True, completed_at__isnull=True).update(
                completed_at=clock.now(using), **counts
            )
            if won:
                batch = batches.get(id=batch_id)
                ids = _enqueue_callbacks(using, batch, counts)
                batches.filter(id=batch_id).update(callback_ids=ids)
        if won:
            completed.append(batch_id)
    return completed


def _enqueue_callbacks(using: str, batch: Any, counts: dict[str, int]) -> list[int]:
    """Insert the batch's callback jobs (fields validated when the batch was made)."""
    job_model = apps.get_model("django_dbqueue", "Job")
    failed = counts["failed"] + counts["cancelled"]
    wanted = {"on_complete": True, "on_success": not failed, "on_failure": bool(failed)}
    info = {"id": batch.id, "total": batch.total, **counts}
    ids, queues = [], set()
    for name in CALLBACKS:
        fields = batch.callbacks.get(name)
        if fields and wanted[name]:
            values = dict(fields, kwargs={**fields.get("kwargs", {}), "batch": info})
            job = job_model.objects.using(using).create(**values)
            ids.append(job.id)
            queues.add(job.queue)
    if queues:
        transaction.on_commit(lambda: announce.notify(sorted(queues)), using=using)
    return ids


def open_batches(using: str, limit: int = 100) -> list[int]:
    """Closed batches not completed yet (for the sweep)."""
    rows = _batches().objects.using(using).filter(closed=True, completed_at__isnull=True)
    return list(rows.order_by("id").values_list("id", flat=True)[:limit])


def uncounted(model: type[Job], using: str, batch_id: int) -> tuple[dict[int, str], bool]:
    """The batch's members that ended without being counted, and whether any has not
    ended (a scan of the batch's rows: the sweep's, for batches that look stuck)."""
    rows = model.objects.using(using).filter(batch_id=batch_id)
    ended = dict(
        rows.filter(status__in=FINISHED, batch_counted=False).values_list("id", "status")[:1000]
    )
    return ended, rows.exclude(status__in=FINISHED).exists()


def prune_completed(using: str, before: Any, batch_size: int, max_seconds: float | None) -> int:
    """Delete the batches completed before ``before`` and their counter shards, a chunk
    of ids at a time (part of retention); returns how many batches. Members that are
    left (kept longer, or requeued) keep their ``batch_id`` and ``batch_counted``: a
    later end of theirs is not counted again, and no callback runs again."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    rows = _batches().objects.using(using)
    deleted = 0
    while deadline is None or time.monotonic() < deadline:
        old = rows.filter(completed_at__lt=before).order_by("completed_at", "id")
        ids = list(old.values_list("id", flat=True)[:batch_size])
        if not ids:
            break
        with write_transaction(using):
            _counters().objects.using(using).filter(batch_id__in=ids).delete()
            deleted += rows.filter(id__in=ids).delete()[0]
        if len(ids) < batch_size:
            break
    return deleted
