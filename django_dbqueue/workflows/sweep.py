"""The workflows' safety net, run by every supervisor between its other duties: waiting
jobs whose dependencies ended (or were deleted) without releasing them, and batches
whose members all ended without completing them (docs/workflows.md, "Crash safety").

Every end recorded by the queue's own paths settles its workflow in its transaction;
this finds what an end outside them left (a dependency deleted before it ended, a
member deleted while queued) and applies the documented rule: a deleted dependency
counts as cancelled, a deleted member counts as cancelled in its batch.
"""

from __future__ import annotations

import time

from django.db import router

from django_dbqueue.models import Batch, Job
from django_dbqueue.queue import batches, dependents
from django_dbqueue.queue.dialects import write_transaction
from django_dbqueue.queue.ends import settle

# A batch whose counts have not moved for this long has its rows looked at (a scan of
# its members: rare, and only for batches that look stuck).
QUIET = 30.0


class Sweeper:
    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, float]] = {}  # batch -> (ended, since)

    def run(self, using: str | None = None) -> tuple[int, int]:
        """One sweep: (dependents resolved, batches completed)."""
        using = using or router.db_for_write(Job)
        return resolve_stuck(using), self._batches(using)

    def _batches(self, using: str) -> int:
        completed = 0
        now = time.monotonic()
        open_ids = batches.open_batches(using)
        self._seen = {k: v for k, v in self._seen.items() if k in open_ids}
        for batch_id in open_ids:
            if batches.complete(using, [batch_id]):
                completed += 1
                continue
            ended = sum(batches.totals(using, batch_id).values())
            seen = self._seen.get(batch_id)
            if seen is None or seen[0] != ended:
                self._seen[batch_id] = (ended, now)
            elif now - seen[1] >= QUIET:
                completed += repair(using, batch_id, ended)
                self._seen.pop(batch_id, None)
        return completed


def resolve_stuck(using: str) -> int:
    """Apply the ends of dependencies that were not applied; how many edges."""
    found = dependents.stuck(Job, using)
    if found:
        with write_transaction(using):
            settle(Job, using, dependents.resolve(Job, using, found))
    return len(found)


def repair(using: str, batch_id: int, ended: int) -> int:
    """A batch whose counts stopped short: count members that ended uncounted; if none
    is left to end, the missing ones were deleted and count as cancelled."""
    uncounted, unfinished = batches.uncounted(Job, using, batch_id)
    if uncounted:
        with write_transaction(using):
            batches.count(Job, using, uncounted)
        return len(batches.complete(using, [batch_id]))
    if unfinished:
        return 0
    total = Batch.objects.using(using).filter(id=batch_id).values_list("total", flat=True)[0]
    return len(batches.complete(using, [batch_id], missing=max(0, total - ended)))
