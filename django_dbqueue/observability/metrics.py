"""The workers' Prometheus metrics, served by ``run_jobs --metrics-port`` for the host.

prometheus_client's multiprocess mode: :func:`serve` (in the supervisor, before it forks
its children) makes a directory for this run, points ``PROMETHEUS_MULTIPROC_DIR`` at it
and creates the metrics; every process then counts into memory-mapped files of its own
there (no database write, no message per job), and the supervisor's HTTP server adds
them up at each scrape. Gauges of processes that are gone are dropped at the next
scrape; their counters stay, so totals never go back. The directory is removed when the
run ends.

Counted through the signals (outcomes as recorded: done, failed, retried, died), the
claim signal, and :mod:`.hooks` around each job's call (running jobs, run time, wait
time, and the outcomes no signal reports: a ``RetryJob`` deferral, a cancel); tallied in
each process and written to its files once a second (:class:`_Tally`).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import util as mp_util
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from django_dbqueue import signals
from django_dbqueue.exceptions import RetryJob
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


class _Counts:
    """What one thread counted since its process began counting. Only that thread writes
    here, so a count takes no lock; the values only grow, and the flusher writes what grew
    since it last looked (a count it reads half made is written at its next look)."""

    __slots__ = ("claims", "finished", "jobs", "running", "wrote")

    def __init__(self) -> None:
        self.finished: dict[tuple[str, str, str], int] = {}  # (queue, task, outcome)
        # (queue, task) -> [run seconds, wait seconds, count per run bucket, per wait bucket]
        self.jobs: dict[tuple[str, str], list[float]] = {}
        self.running: dict[str, int] = {}  # queue -> attempts begun minus attempts ended
        self.claims = [0, 0]  # claims, empty claims
        self.wrote: tuple[dict[Any, int], dict[Any, list[float]], list[int]] = ({}, {}, [0, 0])


class _Tally:
    """Counts in plain Python, one :class:`_Counts` per thread: a job costs a few list
    and dictionary updates. A child's thread writes them to the memory-mapped values
    once every :data:`FLUSH_INTERVAL`, and the child writes them when it exits normally;
    the supervisor (which counts only deaths and kills) writes at once."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.run_bounds = tuple(metrics.run_seconds._upper_bounds)
        self.wait_bounds = tuple(metrics.wait_seconds._upper_bounds)
        self.width = 2 + len(self.run_bounds) + len(self.wait_bounds)
        self.write_through = True
        self._start()

    def _start(self) -> None:
        self.lock = threading.Lock()  # threads joining, and flushes
        self.local = threading.local()
        self.threads: list[_Counts] = []
        self.queues: set[str] = set()  # every queue with a running gauge written
        self.children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # labelled metrics

    def counts(self) -> _Counts:
        """This thread's counts."""
        try:
            counts: _Counts = self.local.counts
        except AttributeError:
            counts = self.local.counts = _Counts()
            with self.lock:
                self.threads.append(counts)
        return counts

    def outcome(self, queue: str, task: str, outcome: str) -> None:
        finished = self.counts().finished
        key = (queue, task, outcome)
        finished[key] = finished.get(key, 0) + 1
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

    def _write(self, counts: _Counts) -> None:
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
        runs = 2 + len(self.run_bounds)
        for histogram, total, buckets in (
            (self.metrics.run_seconds, grown[0], grown[2:runs]),
            (self.metrics.wait_seconds, grown[1], grown[runs:]),
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


class _Timed:
    """The metrics' wrapper around one job's call (:mod:`.hooks`): the running count
    goes up at the start; everything else is one observation at the end."""

    __slots__ = ("began", "counts", "job", "tally")

    def __init__(self, tally: _Tally, job: Job) -> None:
        self.tally = tally
        self.job = job

    def __enter__(self) -> None:
        counts = self.counts = self.tally.counts()
        running, queue = counts.running, self.job.queue
        running[queue] = running.get(queue, 0) + 1
        self.began = time.monotonic()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        ran = time.monotonic() - self.began
        job, tally, counts = self.job, self.tally, self.counts
        # From the job's run_after to its start, in wall-clock time.
        waited = max(0.0, time.time() - ran - job.run_after.timestamp())
        key = (job.queue, job.task)
        sums = counts.jobs.get(key)
        if sums is None:
            sums = counts.jobs[key] = [0.0] * tally.width
        sums[0] += ran
        sums[1] += waited
        sums[2 + bisect_left(tally.run_bounds, ran)] += 1  # the first bucket with le >= ran
        sums[2 + len(tally.run_bounds) + bisect_left(tally.wait_bounds, waited)] += 1
        counts.running[job.queue] -= 1
        if isinstance(exc, RetryJob):  # the deferral no signal reports
            finished = counts.finished
            outcome = (job.queue, job.task, "retried")
            finished[outcome] = finished.get(outcome, 0) + 1
        if tally.write_through:
            tally.flush()


class _Receivers:
    """The signal receivers and the hooks, bound to one run's metrics."""

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

    def recorded(self, job: Job, outcome: str) -> None:
        """An outcome no signal reports (:func:`.hooks.recorded`: a cancel)."""
        self.tally.outcome(job.queue, job.task, outcome)

    def claimed(self, sender: Any, jobs: list[Job], **kwargs: Any) -> None:
        self.tally.claimed(bool(jobs))

    def timed(self, job: Job) -> _Timed:
        return _Timed(self.tally, job)

    def connect(self) -> None:
        # Held strongly (weak=False): the receivers live as long as the run, and each
        # send then skips dereferencing them.
        signals.job_finished.connect(self.finished, weak=False, dispatch_uid=f"{UID}.finished")
        signals.job_failed.connect(self.failed, weak=False, dispatch_uid=f"{UID}.failed")
        signals.jobs_claimed.connect(self.claimed, weak=False, dispatch_uid=f"{UID}.claimed")
        hooks.add(self.timed)
        hooks.listen(self.recorded)

    def disconnect(self) -> None:
        self.tally.flush()
        signals.job_finished.disconnect(dispatch_uid=f"{UID}.finished")
        signals.job_failed.disconnect(dispatch_uid=f"{UID}.failed")
        signals.jobs_claimed.disconnect(dispatch_uid=f"{UID}.claimed")
        hooks.remove(self.timed)
        hooks.unlisten(self.recorded)


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
