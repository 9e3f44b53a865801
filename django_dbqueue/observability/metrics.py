"""The workers' Prometheus metrics, served by ``run_jobs --metrics-port`` for the host.

prometheus_client's multiprocess mode: :class:`Server` (in the supervisor, before it forks
its children) makes a directory for this run, points ``PROMETHEUS_MULTIPROC_DIR`` at it
and creates the metrics; every process then counts into memory-mapped files of its own
there (no database write, no message per job), and the supervisor's HTTP server adds
them up at each scrape. Gauges of processes that are gone are dropped at the next
scrape; their counters stay, so totals never go back. The directory is removed when the
run ends.

Counted through the signals (outcomes as recorded: failed, retried, died), the claim
signal, the conflicts retried (``conflict_retried``, by where: claim, record, ...), and
:mod:`.hooks`: around each job's call (running jobs; at its end one observation of its
run and wait times, and a ``RetryJob`` deferral), the jobs each batched write recorded
done (one call a batch), and the cancels the worker records (before the start, while
running, or by a kill). Tallied per thread
without a lock, and written to the process's files once a second (:mod:`.tallies`).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Iterable
from multiprocessing import util as mp_util
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from django_dbqueue import signals
from django_dbqueue.models import Job
from django_dbqueue.observability import hooks, tallies

UID = "django_dbqueue.observability.metrics"


class _Receivers:
    """The signal receivers and the hooks, bound to one run's metrics."""

    def __init__(self, metrics: tallies.WorkerMetrics) -> None:
        self.tally = tallies.Tally(metrics)
        # The supervisor runs no job's code: a failure it reports is a child's death.
        self.supervisor_pid = os.getpid()
        mp_util.register_after_fork(self, _Receivers._forked)

    def _forked(self) -> None:
        self.tally.forked()

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

    def conflict(self, sender: Any, where: str, **kwargs: Any) -> None:
        self.tally.conflict(where)

    def connect(self) -> None:
        # Held strongly (weak=False): the receivers live as long as the run, and each
        # send then skips dereferencing them.
        signals.job_failed.connect(self.failed, weak=False, dispatch_uid=f"{UID}.failed")
        signals.jobs_claimed.connect(self.claimed, weak=False, dispatch_uid=f"{UID}.claimed")
        signals.conflict_retried.connect(self.conflict, weak=False, dispatch_uid=f"{UID}.conflict")
        hooks.set_meter(self.tally)
        hooks.listen(self.recorded)

    def disconnect(self) -> None:
        self.tally.flush()
        signals.job_failed.disconnect(dispatch_uid=f"{UID}.failed")
        signals.jobs_claimed.disconnect(dispatch_uid=f"{UID}.claimed")
        signals.conflict_retried.disconnect(dispatch_uid=f"{UID}.conflict")
        hooks.set_meter(None)
        hooks.unlisten(self.recorded)


class HostCollector(Collector):
    """Every process's files of the run directory, added up; the live gauges of
    processes that have exited are dropped first (``mark_process_dead``). A file a
    process is creating that moment (a child started in place of a killed one) is left
    for the next scrape: empty, it is no file of values yet, and reading it failed the
    whole scrape (HTTP 500)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterable[Any]:
        for name in glob.glob(os.path.join(self.path, "gauge_live*_*.db")):
            pid = int(name.rsplit("_", 1)[1].removesuffix(".db"))
            if not _alive(pid):
                mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]
        files = [name for name in glob.glob(os.path.join(self.path, "*.db")) if _begun(name)]
        found: Iterable[Any] = MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
        return found


def _begun(name: str) -> bool:
    """Has the process writing ``name`` given it its header (mmap_dict: the first 8
    bytes say how much is used)?"""
    try:
        return os.path.getsize(name) >= 8
    except FileNotFoundError:  # a live gauge of a process marked dead meanwhile
        return False


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
        registry = CollectorRegistry()
        registry.register(HostCollector(self.directory))
        # Bound first: a port that is taken leaves nothing changed in this process.
        try:
            self.httpd, self.thread = start_http_server(port, address, registry=registry)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self.port = int(self.httpd.server_port)
        self._previous_env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self._previous_class = prometheus_values.ValueClass
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.directory
        # Chosen when prometheus_client is imported: choose again, now that the
        # directory is set (metrics made from here on, ours and the jobs', count in it).
        prometheus_values.ValueClass = prometheus_values.MultiProcessValue()  # type: ignore[no-untyped-call]
        self.metrics = tallies.WorkerMetrics.create()
        self.receivers = _Receivers(self.metrics)
        self.receivers.connect()

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
