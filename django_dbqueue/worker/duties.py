"""What a supervisor does for the whole cluster between policing its children: enqueue
the recurring schedules' due ticks and take its turn at retention.

Both run in the supervisor, never in a child, so no job's code can delay a tick; both are
safe to run on every host at once (ticks are unique rows, pruning is a cluster-wide turn).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue.pausing import PauseWatcher
from django_dbqueue.queue.retention import prune_if_due
from django_dbqueue.scheduling.ticks import Ticker, prune_ticks
from django_dbqueue.workflows.sweep import Sweeper

logger = logging.getLogger("django_dbqueue.supervisor")
# How often a supervisor asks at most whether it is its turn to prune (the database
# decides; this only bounds how often each supervisor asks; a shorter RETENTION_INTERVAL
# asks more often).
PRUNE_ASK_EVERY = 10.0
# How often a supervisor sweeps the workflows (workflows/sweep.py): two bounded reads.
SWEEP_EVERY = 5.0


class Duties:
    def __init__(self, queues: Sequence[str], note: Callable[[str], None] | None = None) -> None:
        self.ticker = Ticker()
        self.pauses = PauseWatcher(queues)
        self.note = note
        self._ask_every = min(PRUNE_ASK_EVERY, float(settings.RETENTION_INTERVAL))
        self._prune_at = time.monotonic()  # ask at start: a --burst run may be short
        self._last_note = ""
        self.sweeper = Sweeper()
        self._sweep_at = time.monotonic()

    def run(self) -> list[int]:
        """One turn: the jobs of the ticks it enqueued; database errors propagate to the
        supervisor's retry."""
        enqueued = self.ticker.run_due()
        for tick in enqueued:
            logger.info(
                "Schedule %r: tick %s enqueued as job %s",
                tick.schedule,
                tick.tick_at.isoformat(),
                tick.job_id,
                extra={"event": "schedule_tick", "schedule": tick.schedule},
            )
        now = time.monotonic()
        if now >= self._prune_at:
            self._prune_at = now + self._ask_every
            deleted = prune_if_due()
            if deleted is not None:  # our turn: the old ticks go too
                prune_ticks()
            if deleted:
                logger.info(
                    "Retention: deleted %s finished job(s)", deleted, extra={"event": "pruned"}
                )
        if now >= self._sweep_at:
            self._sweep_at = now + SWEEP_EVERY
            self.sweeper.run()
        self._say_paused()
        return [tick.job_id for tick in enqueued if tick.job_id is not None]

    def _say_paused(self) -> None:
        if self.note is None:
            return
        active, paused = self.pauses.active(), self.pauses.paused
        if not paused:
            text = "" if not self._last_note else "queues resumed: claiming again"
        elif not active:
            text = f"all queues paused ({', '.join(paused)}): claiming nothing until resumed"
        else:
            text = f"paused: {', '.join(paused)} (claiming from {', '.join(active)})"
        if text != self._last_note and (text or self._last_note):
            if text:
                self.note(text)
            self._last_note = "" if text.startswith("queues resumed") else text


class BurstTicks:
    """``--burst``: the jobs of the ticks it enqueued in the queues it drains, so that
    every one runs before the run ends (a child that ran out of work as a tick came is
    started again for it, once per tick: a tick job the new child did not take, its queue
    paused say, is not waited for again, or the run would never end)."""

    def __init__(self, duties: Duties, queues: Sequence[str]) -> None:
        self.duties = duties
        self.queues = list(queues)
        self.pending: set[int] = set()
        self.started_for: set[int] = set()

    def turn(self, running: bool, idle: list[int], stopping: bool) -> list[int]:
        """Enqueue due ticks while children run; return the idle children to start again
        (one per tick job of these queues still queued and not started for yet)."""
        if running:
            self.pending.update(self.duties.run())
        if not self.pending or stopping or not idle:
            return []
        queued = Job.objects.filter(
            pk__in=self.pending, status=Job.Status.QUEUED, queue__in=self.queues
        ).values_list("id", flat=True)
        self.pending = set(queued) - self.started_for
        self.started_for |= self.pending
        return idle[: len(self.pending)]
