"""Counting in a worker process, cheaply: per-thread tallies, and the flush that adds
them to prometheus_client's values (memory-mapped files in multiprocess mode).

Counting takes no lock: a job's start and end (:meth:`Tally.began`, :meth:`Tally.ended`,
told by :mod:`.hooks`) update its thread's own counts and buckets. :class:`Tally` writes
what the counts gained since its last look: once a second from a thread of a child, or
at once in the supervisor.
:mod:`.metrics` feeds it from the signals and :mod:`.hooks`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import Counter as CollectionsCounter
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import util as mp_util
from operator import attrgetter
from time import monotonic
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from django_dbqueue.models import Job

# Seconds: from a millisecond job to a long report, and waits up to an hour's backlog.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
OUTCOMES = ("done", "failed", "retried", "cancelled", "died")
_QUEUE_TASK = attrgetter("queue", "task")
FLUSH_INTERVAL = 1.0  # seconds a child's counts may wait before they can be scraped
CONFLICT_PLACES = ("claim", "record", "heartbeat", "supervisor")  # conflict_retried's where


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


Times = dict[tuple[str, str], list[float]]  # (queue, task) -> a histogram pair's values
Deferrals = dict[tuple[str, str], int]  # (queue, task) -> RetryJob deferrals


class Counts:
    """One thread's counts since its process began counting: only that thread writes
    them, and only upwards, so :meth:`Tally.flush` (another thread) adds what each grew
    by since its last look, with no lock on the job's path."""

    __slots__ = ("retried", "started", "times")

    def __init__(self) -> None:
        self.started: dict[str, int] = {}  # queue -> jobs whose call started
        # (queue, task) -> [run time sum, a count per run bucket, wait time sum, a count
        # per wait bucket]: a histogram pair's values (Tally.wait_at). The run buckets
        # add up to the jobs whose call ended.
        self.times: Times = {}
        self.retried: Deferrals = {}  # RetryJob deferrals


class Tally:
    """What this process counted: a job's start and end go into its thread's
    :class:`Counts` (a few dictionary and list updates); batches, outcomes, claims and
    conflicts are appended to deques (appending is atomic, so threads need no lock).
    :meth:`flush` adds what was counted since its last look to prometheus_client's
    values: from a thread of the child once every :data:`FLUSH_INTERVAL`, and when the
    child exits normally; the supervisor (which counts only deaths and kills) flushes at
    once."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.run_bounds = tuple(metrics.run_seconds._upper_bounds)
        self.wait_bounds = tuple(metrics.wait_seconds._upper_bounds)
        # A times list: the run's sum and buckets (the last +Inf), the wait's from here.
        self.wait_at = 1 + len(self.run_bounds)
        self.shortest = self.run_bounds[0]  # most jobs' bucket, found without bisecting
        self.times_size = self.wait_at + 1 + len(self.wait_bounds)
        self.write_through = True
        self._start()

    def _start(self) -> None:
        self.lock = threading.Lock()  # one flush at a time, and the list of Counts
        # Wall-clock time less monotonic time, as of the last flush (a change of the
        # clock since then is noise to a wait time).
        self.to_wall = time.time() - monotonic()
        self.local = threading.local()
        self.counts: list[Counts] = []  # every thread's
        # What each Counts' times and deferrals were at the last flush: the flush adds
        # the growth since.
        self.seen: dict[Counts, tuple[Times, Deferrals]] = {}
        self.batches: deque[CollectionsCounter[tuple[str, str]]] = deque()  # done, a write
        self.outcomes: deque[tuple[str, str, str]] = deque()  # (queue, task, outcome)
        self.claims: deque[bool] = deque()  # whether each claim took a job
        self.conflicts: deque[str] = deque()  # where each retried conflict happened
        self.children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # labelled metrics

    def _mine(self) -> Counts:
        """This thread's Counts (made on its first job)."""
        try:
            found: Counts = self.local.counts
        except AttributeError:
            found = self.local.counts = Counts()
            with self.lock:
                self.counts.append(found)
        return found

    def began(self, job: Job) -> float:
        """A job's call starts (the hooks' timer, :mod:`.hooks`)."""
        started = self._mine().started
        queue = job.queue
        started[queue] = started.get(queue, 0) + 1
        return monotonic()

    def ended(self, job: Job, began: float, deferred: bool) -> None:
        """Its call ended (``deferred``: by RetryJob): its run and wait times go into
        their buckets (``bisect_left``: the first bucket whose ``le`` is at least it)."""
        ran = monotonic() - began
        counts = self._mine()
        key = (job.queue, job.task)
        times = counts.times.get(key)
        if times is None:
            times = counts.times[key] = [0.0] * self.times_size
        waited = began + self.to_wall - job.run_after.timestamp()
        waited = waited if waited > 0.0 else 0.0
        times[0] += ran
        times[1 if ran <= self.shortest else 1 + bisect_left(self.run_bounds, ran)] += 1
        wait_at = self.wait_at
        times[wait_at] += waited
        times[wait_at + 1 + bisect_left(self.wait_bounds, waited)] += 1
        if deferred:  # a RetryJob deferral, which no signal reports
            counts.retried[key] = counts.retried.get(key, 0) + 1
        if self.write_through:
            self.flush()

    def done(self, jobs: Sequence[Job]) -> None:
        """Jobs a batched write recorded DONE (:func:`.hooks.done`): counted here (in C,
        by ``collections.Counter``), one append for the batch."""
        self.batches.append(CollectionsCounter(map(_QUEUE_TASK, jobs)))
        if self.write_through:
            self.flush()

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
            self.to_wall = time.time() - monotonic()
            finished: dict[tuple[str, str, str], int] = {}
            for _ in range(len(self.outcomes)):
                key = self.outcomes.popleft()
                finished[key] = finished.get(key, 0) + 1
            for _ in range(len(self.batches)):
                for (queue, task), count in self.batches.popleft().items():
                    key = (queue, task, "done")
                    finished[key] = finished.get(key, 0) + count
            running = self._add_times(finished)
            for key, count in finished.items():
                self._child(metrics.finished, key).inc(count)
            for queue, count in running.items():
                self._child(metrics.running, (queue,)).set(count)
            took = [self.claims.popleft() for _ in range(len(self.claims))]
            if took:
                metrics.claims.inc(len(took))
            if not all(took):
                metrics.empty_claims.inc(took.count(False))
            for _ in range(len(self.conflicts)):
                self._child(metrics.conflicts, (self.conflicts.popleft(),)).inc()

    def _add_times(self, finished: dict[tuple[str, str, str], int]) -> dict[str, int]:
        """Add every thread's run and wait times and RetryJob deferrals grown since the
        last flush; return the jobs running now, by queue. Copies are taken in C (the
        dictionaries' and lists' own copy), which no thread switch interrupts."""
        sums: dict[tuple[str, str], list[float]] = {}
        running: dict[str, int] = {}
        wait_at = self.wait_at
        for counts in self.counts:
            # Ends before starts: a job among the ends has its start among the starts.
            times = {key: values[:] for key, values in list(counts.times.items())}
            started, retried = dict(counts.started), dict(counts.retried)
            last_times, last_retried = self.seen.get(counts, ({}, {}))
            for queue, count in started.items():
                running[queue] = running.get(queue, 0) + count
            for (queue, _), values in times.items():
                running[queue] = running.get(queue, 0) - int(sum(values[1:wait_at]))
            for key, values in times.items():
                before = last_times.get(key)
                total = sums.setdefault(key, [0.0] * len(values))
                for i, value in enumerate(values):
                    total[i] += value - (before[i] if before is not None else 0.0)
            for key, count in retried.items():
                grown = count - last_retried.get(key, 0)
                if grown:
                    outcome = (*key, "retried")
                    finished[outcome] = finished.get(outcome, 0) + grown
            self.seen[counts] = (times, retried)
        for key, total in sums.items():
            self._add(self._child(self.metrics.run_seconds, key), total[:wait_at])
            self._add(self._child(self.metrics.wait_seconds, key), total[wait_at:])
        return running

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
