"""The workers' Prometheus metrics, served by ``run_jobs --metrics-port`` for the host.

prometheus_client's multiprocess mode: :func:`serve` (in the supervisor, before it forks
its children) makes a directory for this run, points ``PROMETHEUS_MULTIPROC_DIR`` at it
and creates the metrics; every process then counts into memory-mapped files of its own
there (no database write, no message per job), and the supervisor's HTTP server adds
them up at each scrape. Gauges of processes that are gone are dropped at the next
scrape; their counters stay, so totals never go back. The directory is removed when the
run ends.

Counted through the signals (outcomes as recorded: done, failed, retried, died), the
claim signal, the conflicts retried (``conflict_retried``, by where: claim, record, ...)
and :mod:`.hooks` around each job's call (running jobs, run time, wait time, and the
outcomes no signal reports: a ``RetryJob`` deferral, a cancel); tallied in each process
and written to its files once a second (:class:`_Tally`).
"""

from __future__ import annotations

import bisect
import glob
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import util as mp_util
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from django_dbqueue import signals
from django_dbqueue.exceptions import JobCancelled, RetryJob
from django_dbqueue.models import Job
from django_dbqueue.observability import hooks

# Seconds: from a millisecond job to a long report, and waits up to an hour's backlog.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
OUTCOMES = ("done", "failed", "retried", "cancelled", "died")
UID = "django_dbqueue.observability.metrics"
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
        for where in ("claim", "record", "heartbeat", "supervisor"):
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


class _Tally:
    """What this process counted since its last flush, in plain Python: a job costs a
    few dictionary updates. A child's thread writes the memory-mapped values once every
    :data:`FLUSH_INTERVAL`, and the child writes them when it exits normally; the
    supervisor (which counts only deaths) writes at once."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.lock = threading.Lock()  # threads of a --threads worker count here too
        self.run_bounds = list(metrics.run_seconds._upper_bounds)
        self.wait_bounds = list(metrics.wait_seconds._upper_bounds)
        self.write_through = True
        self._clear()
        self.running: dict[str, int] = {}  # queue -> jobs running now in this process

    def _clear(self) -> None:
        self.finished: dict[tuple[str, str, str], int] = {}
        self.run: dict[tuple[str, str], list[float]] = {}  # [sum, count per bucket...]
        self.wait: dict[tuple[str, str], list[float]] = {}
        self.claims = self.empty_claims = 0
        self.conflicts: dict[str, int] = {}

    def outcome(self, queue: str, task: str, outcome: str) -> None:
        key = (queue, task, outcome)
        with self.lock:
            self.finished[key] = self.finished.get(key, 0) + 1
        self._maybe_flush()

    def claimed(self, took: bool) -> None:
        with self.lock:
            self.claims += 1
            self.empty_claims += 0 if took else 1
        self._maybe_flush()

    def conflict(self, where: str) -> None:
        with self.lock:
            self.conflicts[where] = self.conflicts.get(where, 0) + 1
        self._maybe_flush()

    def started(self, queue: str, task: str, waited: float) -> None:
        with self.lock:
            _observe(self.wait, self.wait_bounds, (queue, task), waited)
            self.running[queue] = self.running.get(queue, 0) + 1
        self._maybe_flush()

    def ended(self, queue: str, task: str, seconds: float, outcome: str | None) -> None:
        with self.lock:
            _observe(self.run, self.run_bounds, (queue, task), seconds)
            self.running[queue] -= 1
            if outcome is not None:
                key = (queue, task, outcome)
                self.finished[key] = self.finished.get(key, 0) + 1
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.write_through:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            finished, run, wait = self.finished, self.run, self.wait
            claims, empty, running = self.claims, self.empty_claims, dict(self.running)
            conflicts = self.conflicts
            self._clear()
        metrics = self.metrics
        for labels, count in finished.items():
            metrics.finished.labels(*labels).inc(count)
        _add(metrics.run_seconds, run)
        _add(metrics.wait_seconds, wait)
        for queue, count in running.items():
            metrics.running.labels(queue).set(count)
        if claims:
            metrics.claims.inc(claims)
        if empty:
            metrics.empty_claims.inc(empty)
        for where, count in conflicts.items():
            metrics.conflicts.labels(where).inc(count)

    def forked(self) -> None:
        """In a new child: count locally, and flush when it exits (not when it is
        killed: those counts are lost, docs/observability.md)."""
        self._clear()
        self.running = {}
        self.write_through = False
        mp_util.Finalize(self, self.flush, exitpriority=100)
        threading.Thread(target=self._flush_every, name="dbqueue-metrics", daemon=True).start()

    def _flush_every(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL)
            self.flush()


def _observe(
    into: dict[tuple[str, str], list[float]],
    bounds: list[float],
    key: tuple[str, str],
    amount: float,
) -> None:
    sums = into.get(key)
    if sums is None:
        sums = into[key] = [0.0] * (len(bounds) + 1)
    sums[0] += amount
    sums[1 + bisect.bisect_left(bounds, amount)] += 1  # the first bucket with le >= amount


def _add(histogram: Histogram, tallied: dict[tuple[str, str], list[float]]) -> None:
    """Add many observations at once: what ``observe`` writes, per bucket (the values
    behind a histogram: its sum and one count per bucket, as prometheus_client keeps
    them since its first releases; the process tests read them back)."""
    for labels, sums in tallied.items():
        child = histogram.labels(*labels)
        child._sum.inc(sums[0])
        for bucket, count in zip(child._buckets, sums[1:], strict=True):
            if count:
                bucket.inc(count)


class _Timed:
    """The metrics' wrapper around one job's call (:mod:`.hooks`)."""

    __slots__ = ("began", "job", "tally")

    def __init__(self, tally: _Tally, job: Job) -> None:
        self.tally = tally
        self.job = job
        self.began = 0.0

    def __enter__(self) -> None:
        job = self.job
        self.began = time.monotonic()
        self.tally.started(job.queue, job.task, max(0.0, time.time() - job.run_after.timestamp()))

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        # What no signal reports: a RetryJob deferral, a cancel while running.
        outcome = None
        if exc is not None:
            if isinstance(exc, RetryJob):
                outcome = "retried"
            elif isinstance(exc, JobCancelled):
                outcome = "cancelled"
        job = self.job
        self.tally.ended(job.queue, job.task, time.monotonic() - self.began, outcome)


class _Receivers:
    """The signal receivers and the call wrapper, bound to one run's metrics."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.tally = _Tally(metrics)
        # The supervisor runs no job's code: a failure it reports is a child's death.
        self.supervisor_pid = os.getpid()
        mp_util.register_after_fork(self, _Receivers._forked)

    def _forked(self) -> None:
        self.tally.forked()

    def finished(self, sender: Any, job: Job, **kwargs: Any) -> None:
        self.tally.outcome(job.queue, job.task, "done")

    def failed(self, sender: Any, job: Job, will_retry: bool = False, **kwargs: Any) -> None:
        if os.getpid() == self.supervisor_pid:
            outcome = "died"
        else:
            outcome = "retried" if will_retry else "failed"
        self.tally.outcome(job.queue, job.task, outcome)

    def claimed(self, sender: Any, jobs: list[Job], **kwargs: Any) -> None:
        self.tally.claimed(bool(jobs))

    def conflict(self, sender: Any, where: str, **kwargs: Any) -> None:
        self.tally.conflict(where)

    def timed(self, job: Job) -> _Timed:
        return _Timed(self.tally, job)

    def connect(self) -> None:
        signals.job_finished.connect(self.finished, dispatch_uid=f"{UID}.finished")
        signals.job_failed.connect(self.failed, dispatch_uid=f"{UID}.failed")
        signals.jobs_claimed.connect(self.claimed, dispatch_uid=f"{UID}.claimed")
        signals.conflict_retried.connect(self.conflict, dispatch_uid=f"{UID}.conflict")
        hooks.add(self.timed)

    def disconnect(self) -> None:
        self.tally.flush()
        signals.job_finished.disconnect(dispatch_uid=f"{UID}.finished")
        signals.job_failed.disconnect(dispatch_uid=f"{UID}.failed")
        signals.jobs_claimed.disconnect(dispatch_uid=f"{UID}.claimed")
        signals.conflict_retried.disconnect(dispatch_uid=f"{UID}.conflict")
        hooks.remove(self.timed)


class HostCollector(Collector):
    """Every process's files of the run directory, added up; the live gauges of
    processes that have exited are dropped first (``mark_process_dead``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.inner = MultiProcessCollector(None, path=path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Any]:
        for name in glob.glob(os.path.join(self.path, "gauge_live*_*.db")):
            pid = int(name.rsplit("_", 1)[1].removesuffix(".db"))
            if not _alive(pid):
                mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]
        found: Iterable[Any] = self.inner.collect()  # type: ignore[no-untyped-call]
        return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child that exited but is not reaped yet is a zombie: gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


class Server:
    """The metrics of one ``run_jobs`` run and the HTTP server that shows them."""

    def __init__(self, port: int, address: str = "0.0.0.0") -> None:
        self.directory = tempfile.mkdtemp(prefix="dbqueue-metrics-")
        self._previous_env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self._previous_class = prometheus_values.ValueClass
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.directory
        # Chosen when prometheus_client is imported: choose again, now that the
        # directory is set (metrics made from here on, ours and the jobs', count in it).
        prometheus_values.ValueClass = prometheus_values.MultiProcessValue()  # type: ignore[no-untyped-call]
        self.metrics = WorkerMetrics.create()
        self.receivers = _Receivers(self.metrics)
        self.receivers.connect()
        registry = CollectorRegistry()
        registry.register(HostCollector(self.directory))
        self.httpd, self.thread = start_http_server(port, address, registry=registry)
        self.port = int(self.httpd.server_port)

    def close(self) -> None:
        self.receivers.disconnect()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)  # gone before anything else forks this process
        prometheus_values.ValueClass = self._previous_class
        if self._previous_env is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._previous_env
        shutil.rmtree(self.directory, ignore_errors=True)
