"""The worker loop: claim a batch, run it, record results, repeat.

One :class:`Worker` runs in one process (its main thread runs jobs; a heartbeat thread
renews its leases). ``run_jobs --concurrency N`` starts N of them under
:class:`django_dbqueue.supervisor.Supervisor`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)
from django.utils import timezone

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import JobTimeout, WorkerShutdown
from django_dbqueue.execution import call_job, time_limit
from django_dbqueue.models import Job
from django_dbqueue.models import Worker as WorkerRow

logger = logging.getLogger("django_dbqueue.worker")

# Errors that mean "the database is busy or briefly gone": retry at the top of the loop.
# (MySQL 1213 deadlock and 1205 lock wait timeout, "server has gone away", SQLite's
# "database is locked", a PostgreSQL restart: Django raises these as OperationalError
# or InterfaceError.)
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)


def make_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class Stats:
    done: int = 0
    failed: int = 0
    retried: int = 0

    @property
    def processed(self) -> int:
        return self.done + self.failed + self.retried


def reset_connections() -> None:
    """Drop connections that errored so the next query reconnects."""
    for conn in connections.all(initialized_only=True):
        try:
            if conn.in_atomic_block:
                continue
            conn.close_if_unusable_or_obsolete()
            if conn.connection is not None and not conn.is_usable():
                conn.close()
        except DatabaseError:
            conn.connection = None


class Worker:
    def __init__(
        self,
        queues: Sequence[str] | None = None,
        batch_size: int | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        name: str | None = None,
        on_progress: Callable[[Stats], None] | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.queues = list(queues or settings.QUEUES)
        self.batch_size = int(batch_size or settings.BATCH_SIZE)
        self.burst = burst
        self.max_jobs = max_jobs
        self.name = name or make_worker_name()
        self.on_progress = on_progress
        self.handle_signals = handle_signals
        self.stats = Stats()
        self.stopping = threading.Event()
        self._running: Job | None = None
        self._pending_done: list[Job] = []
        self._pending_since = 0.0
        self._claimed: list[Job] = []
        self._heartbeat: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the running job, give back the rest of the batch, then exit."""
        self.stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping.is_set() and self._running is not None:
            # Second signal: stop the running job now. It is recorded as a failed
            # attempt (and retried), never silently lost.
            raise WorkerShutdown(f"Worker stopped by signal {signal.Signals(signum).name}")
        logger.info(
            "Worker %s: %s received, finishing the current job",
            self.name,
            signal.Signals(signum).name,
        )
        self.stop()

    def run(self) -> Stats:
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            self._register()
            self._start_heartbeat()
            self._loop()
        finally:
            self._shutdown()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.stats

    def _loop(self) -> None:
        idle_sleep = float(settings.MIN_POLL_INTERVAL)
        failures = 0
        while not self.stopping.is_set():
            if self.max_jobs is not None and self.stats.processed >= self.max_jobs:
                break
            try:
                close_old_connections()
                jobs = self._claim()
                failures = 0
            except TRANSIENT_ERRORS as exc:
                failures += 1
                delay = min(5.0, 0.1 * 2 ** min(failures, 6))
                logger.warning(
                    "Worker %s: database error while claiming (%s); retrying in %.1f s",
                    self.name,
                    exc,
                    delay,
                )
                reset_connections()
                self.stopping.wait(delay)
                continue
            if not jobs:
                self._flush(force=True)
                if self.burst:
                    break
                self.stopping.wait(idle_sleep)
                idle_sleep = min(idle_sleep * 2, float(settings.POLL_INTERVAL))
                continue
            idle_sleep = float(settings.MIN_POLL_INTERVAL)
            self._run_batch(jobs)
            self._flush(force=True)

    def _claim(self) -> list[Job]:
        limit = self.batch_size
        if self.max_jobs is not None:
            limit = max(1, min(limit, self.max_jobs - self.stats.processed))
        jobs = Job.objects.claim(self.name, limit, self.queues)
        self._claimed = list(jobs)
        return jobs

    def _run_batch(self, jobs: list[Job]) -> None:
        for index, job in enumerate(jobs):
            if self.stopping.is_set():
                self._claimed = jobs[index:]  # handed back by _shutdown()
                return
            self._claimed = jobs[index + 1 :]
            self._process(job)
        self._claimed = []

    # -- one job -----------------------------------------------------------------------

    def _process(self, job: Job) -> None:
        job.started_at = timezone.now()
        self._running = job
        signals.job_started.send(Job, job=job, worker=self.name)
        try:
            timeout = job.timeout or settings.JOB_TIMEOUT
            with time_limit(float(timeout) if timeout else None):
                result = call_job(job)
        except (Exception, JobTimeout, WorkerShutdown) as exc:
            self._running = None
            self._record_failure(job, exc)
            if isinstance(exc, WorkerShutdown):
                self.stopping.set()
            return
        self._running = None
        job.result = result
        self._pending_done.append(job)
        if len(self._pending_done) == 1:
            self._pending_since = time.monotonic()
        self._flush()

    def _record_failure(self, job: Job, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(exc))
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        status = self._retry_db(
            lambda: Job.objects.finish_failed_attempt(self.name, job, text, error_class)
        )
        will_retry = status == Job.Status.QUEUED
        if status is None:
            logger.warning(
                "Worker %s: job %s was taken over by another worker; its failure "
                "is not recorded here",
                self.name,
                job.id,
            )
            return
        if will_retry:
            self.stats.retried += 1
            logger.info(
                "Job %s (%s) failed on attempt %s/%s, retry at %s: %s",
                job.id,
                job.task,
                job.attempts,
                job.max_attempts,
                job.run_after.isoformat(),
                exc,
            )
        else:
            self.stats.failed += 1
            logger.error(
                "Job %s (%s) failed after %s attempt(s): %s", job.id, job.task, job.attempts, exc
            )
        signals.job_failed.send(
            Job, job=job, worker=self.name, exception=exc, will_retry=will_retry
        )
        self._progress()

    def _flush(self, force: bool = False) -> None:
        pending = self._pending_done
        if not pending:
            return
        due = time.monotonic() - self._pending_since >= float(settings.FINISH_FLUSH_INTERVAL)
        if not (force or due or len(pending) >= int(settings.FINISH_BATCH_SIZE)):
            return
        self._pending_done = []
        finished = self._retry_db(lambda: Job.objects.finish_done(self.name, pending))
        for job in pending:
            if job.id in finished:
                self.stats.done += 1
                signals.job_finished.send(Job, job=job, worker=self.name, result=job.result)
            else:
                logger.warning(
                    "Worker %s: job %s finished but was taken over by another "
                    "worker meanwhile; not recorded twice",
                    self.name,
                    job.id,
                )
        self._progress()

    def _retry_db(self, write: Callable[[], Any]) -> Any:
        """Run a finishing write until the database takes it.

        The writes are guarded by (status=claimed, owner=us), so repeating one that
        did reach the database before the connection broke changes nothing.
        """
        failures = 0
        while True:
            try:
                return write()
            except TRANSIENT_ERRORS as exc:
                failures += 1
                delay = min(5.0, 0.1 * 2 ** min(failures, 6))
                logger.warning(
                    "Worker %s: database error while recording a result (%s); retrying in %.1f s",
                    self.name,
                    exc,
                    delay,
                )
                reset_connections()
                time.sleep(delay)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.stats)

    # -- registry and heartbeat --------------------------------------------------------

    def _register(self) -> None:
        host, pid = socket.gethostname(), os.getpid()
        self._retry_db(
            lambda: WorkerRow.objects.create(name=self.name, host=host, pid=pid, queues=self.queues)
        )

    def _start_heartbeat(self) -> None:
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, daemon=True, name=f"heartbeat-{self.name}"
        )
        self._heartbeat.start()

    def _heartbeat_loop(self) -> None:
        interval = float(settings.HEARTBEAT_INTERVAL)
        try:
            while not self.stopping.wait(interval):
                self.beat()
        finally:
            connections.close_all()

    def beat(self) -> None:
        """Renew leases, report liveness, recover jobs of dead workers."""
        try:
            Job.objects.renew_leases(self.name)
            WorkerRow.objects.filter(name=self.name).update(
                heartbeat_at=timezone.now(),
                jobs_done=self.stats.done,
                jobs_failed=self.stats.failed,
            )
            requeued, failed = Job.objects.recover_expired()
            if requeued or failed:
                logger.warning(
                    "Recovered %s job(s) from dead workers (%s requeued, %s failed)",
                    requeued + failed,
                    requeued,
                    failed,
                )
        except TRANSIENT_ERRORS as exc:
            logger.warning("Worker %s: heartbeat failed (%s); will retry", self.name, exc)
            reset_connections()

    def _shutdown(self) -> None:
        self.stopping.set()
        try:
            self._flush(force=True)
            unstarted = [job.id for job in self._claimed]
            if unstarted:
                given = self._retry_db(lambda: Job.objects.give_back(self.name, unstarted))
                logger.info("Worker %s: gave back %s unstarted job(s)", self.name, given)
            self._claimed = []
            self._retry_db(lambda: WorkerRow.objects.filter(name=self.name).delete())
        finally:
            if self._heartbeat is not None:
                self._heartbeat.join(timeout=float(settings.HEARTBEAT_INTERVAL) + 5)
