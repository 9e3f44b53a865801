"""Counting in a worker process, cheaply: what each batch of jobs came to, counted per
batch, and the flush that adds it to prometheus_client's values (memory-mapped files in
multiprocess mode).

A job is not counted on its own: the recorder tells :meth:`Tally.ended` what a batched
write of done jobs came to (their tasks, starts and run times, which it keeps anyway),
and a failed, retried or cancelled attempt as it is recorded. The call works on the
whole batch in C (``map``, ``bisect``, ``collections.Counter``, ``list.count``: most
batches are of one task, whose strings are then compared once a job, not hashed into
keys) and appends the result to a deque (atomic: threads need no lock);
:meth:`Tally.flush` adds what was appended since its last look, once a second from a
thread of a child, or at once in the supervisor. Jobs running now are looked at when
the flush runs (:func:`.hooks.running`), not counted as they start.
:mod:`.metrics` feeds it from the signals and :mod:`.hooks`.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections import Counter as CollectionsCounter
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import repeat
from multiprocessing import util as mp_util
from operator import attrgetter, sub
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from django_dbqueue.models import Job
from django_dbqueue.observability import hooks

# Seconds: from a millisecond job to a long report, and waits up to an hour's backlog.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_QUEUE_TASK = attrgetter("queue", "task")
_QUEUE, _TASK, _RUN_AFTER = attrgetter("queue"), attrgetter("task"), attrgetter("run_after")
_NO_WAIT = timedelta(0)
FLUSH_INTERVAL = 1.0  # seconds a child's counts may wait before they can be scraped
CONFLICT_PLACES = ("claim", "record", "heartbeat", "supervisor")  # conflict_retried's where

Key = tuple[str, str]  # (queue, task)


@dataclass
class Timed:
    """One task's jobs of a batch: how many fell in each bucket (by the bucket's index
    in the bounds), and the sums of their times."""

    runs: dict[int, int]
    waits: dict[int, int]
    run_sum: float
    wait_sum: timedelta


@dataclass
class Batch:
    """What one call of :meth:`Tally.ended` counted."""

    timed: dict[Key, Timed]
    done: dict[Key, int]


def bucket_counts(bounds: tuple[Any, ...], values: list[Any]) -> dict[int, int]:
    """How many of ``values`` fall in each bucket of ``bounds`` (``bisect_left``: the
    first bucket whose bound is at least the value), by the bucket's index. When the
    least and the greatest share a bucket (jobs of one kind mostly do), so do all."""
    low, high = bisect_left(bounds, min(values)), bisect_left(bounds, max(values))
    if low == high:
        return {low: len(values)}
    found = bytes(map(bisect_left, repeat(bounds), values))  # at most 255 buckets
    return {at: count for at in range(low, high + 1) if (count := found.count(at))}


@dataclass
class WorkerMetrics:
    """The metric objects; names as exposed (docs/observability.md lists them)."""

    finished: Counter
    run_seconds: Histogram
    wait_seconds: Histogram
    running: Gauge
    claims: Counter
    empty_claims: Counter
    conflicts: Counter

    @classmethod
    def create(cls) -> WorkerMetrics:
        job = ("queue", "task")
        return cls(
            finished=Counter(
                "dbqueue_jobs_finished_total",
                "Jobs whose attempt ended, by outcome (done, failed, retried, cancelled, died).",
                [*job, "outcome"],
                registry=None,
            ),
            run_seconds=Histogram(
                "dbqueue_job_run_seconds",
                "Time a job's code ran.",
                job,
                buckets=RUN_BUCKETS,
                registry=None,
            ),
            wait_seconds=Histogram(
                "dbqueue_job_wait_seconds",
                "Time from a job's run_after (its enqueue, or its retry time) to its start.",
                job,
                buckets=WAIT_BUCKETS,
                registry=None,
            ),
            running=Gauge(
                "dbqueue_jobs_running",
                "Jobs running now in this host's workers.",
                ["queue"],
                multiprocess_mode="livesum",
                registry=None,
            ),
            claims=Counter("dbqueue_claims_total", "Claims the workers made.", registry=None),
            empty_claims=Counter(
                "dbqueue_empty_claims_total", "Claims that found no job to take.", registry=None
            ),
            conflicts=Counter(
                "dbqueue_conflicts_retried_total",
                "Writes retried after a deadlock, lock wait timeout or lost Galera certification.",
                ["where"],
                registry=None,
            ),
        )

    def __post_init__(self) -> None:
        # Exposed at 0 from the start, like the other counters, not when first met.
        for where in CONFLICT_PLACES:
            self.conflicts.labels(where)

    def all(self) -> tuple[Any, ...]:
        return (
            self.finished,
            self.run_seconds,
            self.wait_seconds,
            self.running,
            self.claims,
            self.empty_claims,
            self.conflicts,
        )


class Tally:
    """What this process counted: each call appends one batch's counts to a deque;
    :meth:`flush` adds what was appended since its last look to prometheus_client's
    values: from a thread of the child once every :data:`FLUSH_INTERVAL`, and when the
    child exits normally; the supervisor (which counts only deaths and kills) flushes at
    once."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.run_bounds = tuple(metrics.run_seconds._upper_bounds)
        # Waits are differences of datetimes: bucketed as timedeltas, converted once a
        # batch (datetime.timestamp() a job cost more than the rest of the count).
        self.wait_bounds = tuple(
            timedelta.max if bound == math.inf else timedelta(seconds=bound)
            for bound in metrics.wait_seconds._upper_bounds
        )
        self.write_through = True
        self._start()

    def _start(self) -> None:
        self.lock = threading.Lock()  # one flush at a time
        self.batches: deque[Batch] = deque()  # what each call of ended() counted
        self.outcomes: deque[tuple[str, str, str]] = deque()  # (queue, task, outcome)
        self.claims: deque[bool] = deque()  # whether each claim took a job
        self.conflicts: deque[str] = deque()  # where each retried conflict happened
        self.children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # labelled metrics
        self.shown_running: set[str] = set()  # queues the running gauge was set for

    def ended(
        self,
        jobs: Sequence[Job],
        started: Sequence[datetime],
        ran: Sequence[float],
        done: Sequence[Job],
    ) -> None:
        """The calls of ``jobs`` ended (:func:`.hooks.ended`): their run and wait times
        counted by bucket, a wait before ``run_after`` (another host's clock) as none;
        and ``done`` of them (a part of ``jobs``) counted DONE."""
        count = len(jobs)
        if not count:
            return
        queues, tasks = list(map(_QUEUE, jobs)), list(map(_TASK, jobs))
        waited = list(map(sub, started, map(_RUN_AFTER, jobs)))
        if min(waited) < _NO_WAIT:
            waited = [wait if wait > _NO_WAIT else _NO_WAIT for wait in waited]
        if queues.count(queues[0]) == count and tasks.count(tasks[0]) == count:
            key = (queues[0], tasks[0])  # one task, as most batches are
            timed = {key: self._timed(list(ran), waited)}
            batch = Batch(timed, {key: len(done)} if done else {})
        else:
            groups: dict[Key, tuple[list[float], list[timedelta]]] = {}
            keys = zip(queues, tasks, strict=True)
            for key, run, wait in zip(keys, ran, waited, strict=True):
                group = groups.get(key)
                if group is None:
                    group = groups[key] = ([], [])
                group[0].append(run)
                group[1].append(wait)
            timed = {key: self._timed(runs, waits) for key, (runs, waits) in groups.items()}
            batch = Batch(timed, CollectionsCounter(map(_QUEUE_TASK, done)))
        self.batches.append(batch)
        if self.write_through:
            self.flush()

    def _timed(self, ran: list[float], waited: list[timedelta]) -> Timed:
        return Timed(
            bucket_counts(self.run_bounds, ran),
            bucket_counts(self.wait_bounds, waited),
            sum(ran),
            sum(waited, _NO_WAIT),
        )

    def outcome(self, queue: str, task: str, outcome: str) -> None:
        self.outcomes.append((queue, task, outcome))
        if self.write_through:
            self.flush()

    def claimed(self, took: bool) -> None:
        self.claims.append(took)
        if self.write_through:
            self.flush()

    def conflict(self, where: str) -> None:
        self.conflicts.append(where)
        if self.write_through:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            metrics = self.metrics
            finished: dict[tuple[str, str, str], int] = {}
            for _ in range(len(self.outcomes)):
                key = self.outcomes.popleft()
                finished[key] = finished.get(key, 0) + 1
            self._add_batches(finished)
            for key, count in finished.items():
                self._child(metrics.finished, key).inc(count)
            self._show_running()
            took = [self.claims.popleft() for _ in range(len(self.claims))]
            if took:
                metrics.claims.inc(len(took))
            if not all(took):
                metrics.empty_claims.inc(took.count(False))
            for _ in range(len(self.conflicts)):
                self._child(metrics.conflicts, (self.conflicts.popleft(),)).inc()

    def _add_batches(self, finished: dict[tuple[str, str, str], int]) -> None:
        """Add the batches counted since the last flush: per (queue, task), the run
        time's sum and a count per bucket, the same for the wait, and the done jobs."""
        runs: dict[Key, list[float]] = {}
        waits: dict[Key, list[float]] = {}
        run_size, wait_size = len(self.run_bounds) + 1, len(self.wait_bounds) + 1
        for _ in range(len(self.batches)):
            batch = self.batches.popleft()
            for key, timed in batch.timed.items():
                if key not in runs:
                    runs[key], waits[key] = [0.0] * run_size, [0.0] * wait_size
                run, wait = runs[key], waits[key]
                run[0] += timed.run_sum
                wait[0] += timed.wait_sum.total_seconds()
                for at, count in timed.runs.items():
                    run[1 + at] += count
                for at, count in timed.waits.items():
                    wait[1 + at] += count
            for (queue, task), count in batch.done.items():
                outcome = (queue, task, "done")
                finished[outcome] = finished.get(outcome, 0) + count
        for key, values in runs.items():
            self._add(self._child(self.metrics.run_seconds, key), values)
            self._add(self._child(self.metrics.wait_seconds, key), waits[key])

    def _show_running(self) -> None:
        """Set the running gauge from the jobs running now (the executors' own view,
        :func:`.hooks.running`), and to 0 for queues shown before."""
        running = hooks.running()
        for queue in self.shown_running | running.keys():
            self._child(self.metrics.running, (queue,)).set(running.get(queue, 0))
        self.shown_running |= running.keys()

    @staticmethod
    def _add(child: Any, sums: list[float]) -> None:
        """Add many observations at once: what ``observe`` writes, per bucket (the values
        behind a histogram: its sum and one count per bucket, as prometheus_client keeps
        them since its first releases; the process tests read them back)."""
        if sums[0]:
            child._sum.inc(sums[0])
        for bucket, count in zip(child._buckets, sums[1:], strict=True):
            if count:
                bucket.inc(count)

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        child = self.children.get((metric, labels))
        if child is None:
            child = self.children[(metric, labels)] = metric.labels(*labels)
        return child

    def forked(self) -> None:
        """In a new child: count afresh (the supervisor wrote its own), flush from a
        thread and when the child exits (not when it is killed: those counts are lost,
        docs/observability.md)."""
        self._start()
        self.write_through = False
        mp_util.Finalize(self, self.flush, exitpriority=100)
        threading.Thread(target=self._flush_every, name="dbqueue-metrics", daemon=True).start()

    def _flush_every(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL)
            self.flush()
