"""Per-task figures of the last hour for the dashboard: how many jobs finished, the share
that failed, and the median and 95th percentile of their run time and wait time.

Four statements whatever the number of rows or tasks, each on the last hour's range of
the history index ``dbq_job_finished`` (through ``finished_with``, as every reader of
finished jobs): per status, a count per task, and the newest ``SAMPLE`` jobs' times. The
percentiles come from that sample, so they are exact while an hour has at most
``SAMPLE`` jobs of a status and describe the newest ones beyond (the page says so).

Run time is the last attempt's, ``finished_at`` minus its start; wait time is how long
that attempt was due before a worker started it, its start minus ``run_after`` (a retry's
backoff is not waiting: ``run_after`` is the end of the backoff).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import router
from django.db.models import Count

from django_dbqueue.admin.dashboard import humanize
from django_dbqueue.models import Job

# Finished jobs per status whose times make the percentiles: one bounded read.
SAMPLE = 5_000
WINDOW = timedelta(hours=1)
FINISHED_AS = (Job.Status.DONE, Job.Status.FAILED)


def percentile(ordered: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of sorted values (None when there are none)."""
    if not ordered:
        return None
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def seconds_label(seconds: float | None) -> str:
    """A run or wait time: to the hundredth below 10 s, as the dashboard's ages above."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f} s"
    return humanize(timedelta(seconds=seconds))


@dataclass
class TaskFigures:
    task: str
    done: int = 0
    failed: int = 0
    read: int = 0  # of the sampled rows
    run_times: list[float] = field(default_factory=list, repr=False)
    wait_times: list[float] = field(default_factory=list, repr=False)

    @property
    def count(self) -> int:
        return self.done + self.failed

    @property
    def failure_rate(self) -> float:
        return self.failed / self.count if self.count else 0.0

    @property
    def failure_label(self) -> str:
        return f"{self.failure_rate * 100:.1f} %"

    @property
    def sampled(self) -> bool:
        """True when the percentiles describe only the newest of the hour's jobs."""
        return self.read < self.count

    def _label(self, times: list[float], fraction: float) -> str:
        return seconds_label(percentile(sorted(times), fraction))

    @property
    def run_p50(self) -> str:
        return self._label(self.run_times, 0.5)

    @property
    def run_p95(self) -> str:
        return self._label(self.run_times, 0.95)

    @property
    def wait_p50(self) -> str:
        return self._label(self.wait_times, 0.5)

    @property
    def wait_p95(self) -> str:
        return self._label(self.wait_times, 0.95)


def task_figures(now: datetime, sample: int = SAMPLE) -> list[TaskFigures]:
    """The last hour's figures of every task that finished a job, busiest first."""
    since = now - WINDOW
    using = router.db_for_read(Job)
    figures: dict[str, TaskFigures] = {}

    def of(task: str) -> TaskFigures:
        return figures.setdefault(task, TaskFigures(task))

    for status in FINISHED_AS:
        recent = Job.objects.using(using).finished_with(status).filter(finished_at__gte=since)
        counted = recent.values("task").annotate(n=Count("id")).order_by().values_list("task", "n")
        for task, n in counted:
            if status == Job.Status.DONE:
                of(task).done = n
            else:
                of(task).failed = n
        times = recent.order_by("-finished_at").values_list(
            "task", "run_after", "started_at", "last_attempted_at", "finished_at"
        )[:sample]
        for task, run_after, started, last_attempted, finished in times:
            of(task).read += 1
            start = last_attempted or started
            if start is None or finished is None:  # settled without a started attempt
                continue
            of(task).run_times.append(max(0.0, (finished - start).total_seconds()))
            of(task).wait_times.append(max(0.0, (start - run_after).total_seconds()))
    return sorted(figures.values(), key=lambda f: (-f.count, f.task))
