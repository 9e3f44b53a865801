"""Readable progress lines for run_jobs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from django_dbqueue.worker.recording import Stats
from django_dbqueue.worker.slots import Slot


def stop_line(signal_name: str, count: int, slots: Sequence[Slot]) -> str:
    """What ``run_jobs`` says when told to stop: the running jobs it lets finish and the
    claimed ones it hands back (the first signal), or that it stops them now (the next)."""
    running = held = 0
    for slot in slots:
        runs = {run.job_id for run in slot.runs()}
        done = {entry.job_id for entry in slot.done_log()}
        running += len(runs)
        held += len(set(slot.held()) - runs - done)
    if count == 1:
        return (
            f"stopping: finishing {running} running jobs, handing back {held} "
            f"({signal_name}; send it again to stop the running jobs now)"
        )
    return (
        f"stopping now: a second {signal_name}, interrupting {running} running jobs "
        "(each recorded as a failed attempt)"
    )


class Progress:
    """Prints a line every ``interval`` seconds while counts change, and a summary."""

    def __init__(self, write: Callable[[str], None], interval: float = 2.0) -> None:
        self.write = write
        self.interval = interval
        self.started = time.monotonic()
        self._last_time = self.started
        self._last = Stats()

    def update(self, stats: Stats, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_time < self.interval:
            return
        if stats == self._last:
            self._last_time = now
            return
        span = max(now - self._last_time, 1e-9)
        rate = (stats.processed - self._last.processed) / span
        self.write(
            f"{time.strftime('%H:%M:%S')}  done {stats.done:>8}  failed {stats.failed:>6}  "
            f"retried {stats.retried:>6}  {rate:>9.1f} jobs/s"
        )
        self._last_time, self._last = now, Stats(stats.done, stats.failed, stats.retried)

    def note(self, text: str) -> None:
        """A line about the worker's state (paused queues...), timestamped like the rest."""
        self.write(f"{time.strftime('%H:%M:%S')}  {text}")

    def summary(self, stats: Stats) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (
            f"Finished: {stats.done} done, {stats.failed} failed, {stats.retried} retried "
            f"in {elapsed:.1f} s ({stats.processed / elapsed:.1f} jobs/s)"
        )
