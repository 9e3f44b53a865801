"""Counting in a worker process, cheaply: per-thread tallies, and the flush that adds
them to prometheus_client's values (memory-mapped files in multiprocess mode).

Counting takes no lock: a job costs an append when its call starts and one when it ends
(:meth:`Tally.began`, :meth:`Tally.ended`, told by :mod:`.hooks`); its run and wait
times are observed by the flush. :class:`Tally` writes what the counts gained since its
last look: once a second from a thread of a child, or at once in the supervisor.
:mod:`.metrics` feeds it from the signals and :mod:`.hooks`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from multiprocessing import util as mp_util
from time import monotonic
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from django_dbqueue.models import Job

# Seconds: from a millisecond job to a long report, and waits up to an hour's backlog.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
OUTCOMES = ("done", "failed", "retried", "cancelled", "died")
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


class Tally:
    """What this process counted since its last flush, as events in deques: appending
    to a deque is atomic, so the threads of a child count with no lock, and a job costs
    two appends (:meth:`began`, :meth:`ended`). The sums, buckets and labelled values are
    worked out by :meth:`flush`: from a thread of the child once every :data:`FLUSH_INTERVAL`, and
    when the child exits normally; the supervisor (which counts only deaths and kills)
    flushes at once."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.run_bounds = tuple(metrics.run_seconds._upper_bounds)
        self.wait_bounds = tuple(metrics.wait_seconds._upper_bounds)
        self.write_through = True
        self._start()

    def _start(self) -> None:
        self.lock = threading.Lock()  # one flush at a time
        self.begun: deque[str] = deque()  # the queue of each job started
        # Each job ended: (queue, task, run_after, monotonic start and end, deferred by
        # RetryJob). Not the Job: kept alive until the flush, jobs would outlive the
        # garbage collector's young generations and make its full collections slower.
        self.calls: deque[tuple[str, str, datetime, float, float, bool]] = deque()
        self.outcomes: deque[tuple[str, str, str]] = deque()  # (queue, task, outcome)
        self.batches: deque[dict[tuple[str, str, str], int]] = deque()  # done, per write
        self.claims: deque[bool] = deque()  # whether each claim took a job
        self.conflicts: deque[str] = deque()  # where each retried conflict happened
        self.running: dict[str, int] = {}  # queue -> jobs running, as of the last flush
        self.children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # labelled metrics

    def began(self, job: Job) -> float:
        """A job's call starts (the hooks' timer, :mod:`.hooks`): one append."""
        self.begun.append(job.queue)
        return monotonic()

    def ended(self, job: Job, began: float, deferred: bool) -> None:
        """Its call ended (``deferred``: by RetryJob): one append; the flush does the rest."""
        self.calls.append((job.queue, job.task, job.run_after, began, monotonic(), deferred))
        if self.write_through:
            self.flush()

    def done(self, jobs: Sequence[Job]) -> None:
        """Jobs a batched write recorded DONE (:func:`.hooks.done`): counted here, one
        append for the batch."""
        counts: dict[tuple[str, str, str], int] = {}
        for job in jobs:
            key = (job.queue, job.task, "done")
            counts[key] = counts.get(key, 0) + 1
        self.batches.append(counts)
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
            metrics, running = self.metrics, self.running
            finished: dict[tuple[str, str, str], int] = {}
            for _ in range(len(self.outcomes)):
                key = self.outcomes.popleft()
                finished[key] = finished.get(key, 0) + 1
            for _ in range(len(self.batches)):
                for key, count in self.batches.popleft().items():
                    finished[key] = finished.get(key, 0) + count
            # The ends counted before the starts: every job among them has its start
            # (appended first, by the same thread) among the starts read after.
            ends = len(self.calls)
            for _ in range(len(self.begun)):
                queue = self.begun.popleft()
                running[queue] = running.get(queue, 0) + 1
            self._observe(ends, finished)
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

    def _observe(self, ends: int, finished: dict[tuple[str, str, str], int]) -> None:
        """The first ``ends`` ended jobs: their run and wait times, added per bucket
        (for each (queue, task): the run's sum and bucket counts, then the wait's)."""
        sums: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        run_bounds, wait_bounds, running = self.run_bounds, self.wait_bounds, self.running
        pop = self.calls.popleft
        # Wall-clock time of a monotonic instant (a second's clock change is noise here).
        to_wall = time.time() - time.monotonic()
        for _ in range(ends):
            queue, task, run_after, began, ended, deferred = pop()
            key = (queue, task)
            both = sums.get(key)
            if both is None:
                both = sums[key] = ([0.0] * (len(run_bounds) + 1), [0.0] * (len(wait_bounds) + 1))
            runs, waits = both
            ran = ended - began
            waited = max(0.0, began + to_wall - run_after.timestamp())
            runs[0] += ran
            runs[1 + bisect_left(run_bounds, ran)] += 1  # the first bucket with le >= it
            waits[0] += waited
            waits[1 + bisect_left(wait_bounds, waited)] += 1
            running[queue] -= 1
            if deferred:  # a RetryJob deferral, which no signal reports
                outcome = (queue, task, "retried")
                finished[outcome] = finished.get(outcome, 0) + 1
        for key, (runs, waits) in sums.items():
            self._add(self._child(self.metrics.run_seconds, key), runs)
            self._add(self._child(self.metrics.wait_seconds, key), waits)

    @staticmethod
    def _add(child: Any, sums: list[float]) -> None:
        """Add many observations at once: what ``observe`` writes, per bucket (the values
        behind a histogram: its sum and one count per bucket, as prometheus_client keeps
        them since its first releases; the process tests read them back)."""
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
