"""Counting in a worker process, cheaply: per-thread tallies, and the flush that adds
them to prometheus_client's values (memory-mapped files in multiprocess mode).

Each thread counts into a :class:`Counts` of its own, with no lock: a job costs a few
list and dictionary updates (:class:`Timed`, around its call, observes its run and
wait times once, at its end). :class:`Tally` writes what the counts gained since its
last look: once a second from a thread of a child, or at once in the supervisor.
:mod:`.metrics` feeds it from the signals and :mod:`.hooks`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from multiprocessing import util as mp_util
from time import monotonic
from time import time as wall_time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from django_dbqueue.exceptions import RetryJob
from django_dbqueue.models import Job

# Seconds: from a millisecond job to a long report, and waits up to an hour's backlog.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
OUTCOMES = ("done", "failed", "retried", "cancelled", "died")
FLUSH_INTERVAL = 1.0  # seconds a child's counts may wait before they can be scraped


@dataclass
class WorkerMetrics:
    """The metric objects; names as exposed (docs/observability.md lists them)."""

    finished: Counter
    run_seconds: Histogram
    wait_seconds: Histogram
    running: Gauge
    claims: Counter
    empty_claims: Counter

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
        )

    def all(self) -> tuple[Any, ...]:
        return (
            self.finished,
            self.run_seconds,
            self.wait_seconds,
            self.running,
            self.claims,
            self.empty_claims,
        )


class Counts:
    """What one thread counted since its process began counting. Only that thread writes
    here, so a count takes no lock; the values only grow, and the flusher writes what grew
    since it last looked (a count it reads half made is written at its next look)."""

    __slots__ = ("claims", "finished", "jobs", "running", "wrote")

    def __init__(self) -> None:
        self.finished: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        # (queue, task) -> [run seconds, wait seconds, count per run bucket, per wait bucket]
        self.jobs: dict[tuple[str, str], list[float]] = {}
        self.running: defaultdict[str, int] = defaultdict(int)  # begun minus ended, by queue
        self.claims = [0, 0]  # claims, empty claims
        self.wrote: tuple[dict[Any, int], dict[Any, list[float]], list[int]] = ({}, {}, [0, 0])


class Tally:
    """Counts in plain Python, one :class:`Counts` per thread: a job costs a few list
    and dictionary updates. A child's thread writes them to the memory-mapped values
    once every :data:`FLUSH_INTERVAL`, and the child writes them when it exits normally;
    the supervisor (which counts only deaths and kills) writes at once."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.run_bounds = tuple(metrics.run_seconds._upper_bounds)
        self.wait_bounds = tuple(metrics.wait_seconds._upper_bounds)
        self.waits_at = 2 + len(self.run_bounds)  # [run, wait, run buckets, wait buckets]
        self.width = self.waits_at + len(self.wait_bounds)
        self.write_through = True
        self._start()

    def _start(self) -> None:
        self.lock = threading.Lock()  # threads joining, and flushes
        self.local = threading.local()
        self.threads: list[Counts] = []
        self.queues: set[str] = set()  # every queue with a running gauge written
        self.children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # labelled metrics

    def counts(self) -> Counts:
        """This thread's counts."""
        try:
            counts: Counts = self.local.counts
        except AttributeError:
            counts = self.local.counts = Counts()
            with self.lock:
                self.threads.append(counts)
        return counts

    def outcome(self, queue: str, task: str, outcome: str) -> None:
        try:
            counts = self.local.counts
        except AttributeError:
            counts = self.counts()
        counts.finished[(queue, task, outcome)] += 1
        if self.write_through:
            self.flush()

    def claimed(self, took: bool) -> None:
        claims = self.counts().claims
        claims[0] += 1
        if not took:
            claims[1] += 1
        if self.write_through:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            running: dict[str, int] = dict.fromkeys(self.queues, 0)
            for counts in list(self.threads):
                self._write(counts)
                for queue, count in list(counts.running.items()):
                    running[queue] = running.get(queue, 0) + count
            for queue, count in running.items():
                self._child(self.metrics.running, (queue,)).set(count)
            self.queues.update(running)

    def _write(self, counts: Counts) -> None:
        """Add what ``counts`` gained since the last flush to the metrics."""
        metrics = self.metrics
        wrote_finished, wrote_jobs, wrote_claims = counts.wrote
        finished = counts.finished.copy()
        for key, count in finished.items():
            if count != wrote_finished.get(key, 0):
                self._child(metrics.finished, key).inc(count - wrote_finished.get(key, 0))
        jobs = {key: list(sums) for key, sums in list(counts.jobs.items())}
        empty = [0.0] * self.width
        for pair, sums in jobs.items():
            old = wrote_jobs.get(pair, empty)
            if sums != old:
                self._add(pair, [new - before for new, before in zip(sums, old, strict=True)])
        claims = list(counts.claims)
        if claims[0] != wrote_claims[0]:
            metrics.claims.inc(claims[0] - wrote_claims[0])
        if claims[1] != wrote_claims[1]:
            metrics.empty_claims.inc(claims[1] - wrote_claims[1])
        counts.wrote = (finished, jobs, claims)

    def _add(self, key: tuple[str, str], grown: list[float]) -> None:
        """Add many observations at once: what ``observe`` writes, per bucket (the values
        behind a histogram: its sum and one count per bucket, as prometheus_client keeps
        them since its first releases; the process tests read them back)."""
        for histogram, total, buckets in (
            (self.metrics.run_seconds, grown[0], grown[2 : self.waits_at]),
            (self.metrics.wait_seconds, grown[1], grown[self.waits_at :]),
        ):
            child = self._child(histogram, key)
            if total:
                child._sum.inc(total)
            for bucket, count in zip(child._buckets, buckets, strict=True):
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


class Timed:
    """The metrics' wrapper around one job's call (:mod:`.hooks`): the running count
    goes up at the start; everything else is one observation at the end."""

    __slots__ = ("began", "counts", "job", "tally")

    def __init__(self, tally: Tally, job: Job) -> None:
        self.tally = tally
        self.job = job

    def __enter__(self) -> None:
        try:
            counts = self.counts = self.tally.local.counts
        except AttributeError:
            counts = self.counts = self.tally.counts()
        counts.running[self.job.queue] += 1
        self.began = monotonic()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        ran = monotonic() - self.began
        job, tally, counts = self.job, self.tally, self.counts
        # From the job's run_after to its start, in wall-clock time.
        waited = wall_time() - ran - job.run_after.timestamp()
        if waited < 0.0:
            waited = 0.0
        key = (job.queue, job.task)
        sums = counts.jobs.get(key)
        if sums is None:
            sums = counts.jobs[key] = [0.0] * tally.width
        sums[0] += ran
        sums[1] += waited
        sums[2 + bisect_left(tally.run_bounds, ran)] += 1  # the first bucket with le >= ran
        sums[tally.waits_at + bisect_left(tally.wait_bounds, waited)] += 1
        counts.running[job.queue] -= 1
        if exc is not None and isinstance(exc, RetryJob):  # a deferral no signal reports
            counts.finished[(job.queue, job.task, "retried")] += 1
        if tally.write_through:
            tally.flush()
