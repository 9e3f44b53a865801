"""The worker loop: claim a batch, run it, record results, repeat.

One :class:`Worker` runs in one process: its main thread runs jobs, and a heartbeat
thread renews the leases of the jobs it holds, reports that it is alive, notices
cancellations and recovers jobs of dead workers. ``run_jobs --concurrency N`` starts N
of them under :class:`django_dbqueue.worker.supervisor.Supervisor`.
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
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.utils import timezone

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import (
    JobCancelled,
    JobTimeout,
    RetryJob,
    UnregisteredTask,
    WorkerShutdown,
)
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.scheduling.pausing import PauseWatcher
from django_dbqueue.worker import wakeup
from django_dbqueue.worker.execution import call_job, time_limit

logger = logging.getLogger("django_dbqueue.worker")
T = TypeVar("T")

# "The database is busy or briefly gone": MySQL 1213 (deadlock) and 1205 (lock wait
# timeout), 2006/2013 (server gone away, lost connection), SQLite "database is locked",
# a PostgreSQL restart. Django raises all of them as OperationalError or InterfaceError.
# They are retried at the top of the worker loop, never inside a caller's transaction.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
# Rows of workers silent for this long are deleted (admin shows them as dead until then).
DEAD_WORKER_ROW_TTL = timedelta(hours=1)


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


def refresh_connections() -> None:
    """Drop connections that saw an error and no longer work, so the next query reconnects.

    Unlike ``close_old_connections()`` this keeps healthy connections open whatever
    CONN_MAX_AGE says: a worker reconnecting before every job would spend its time
    connecting.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        try:
            if conn.errors_occurred:
                if conn.is_usable():
                    conn.errors_occurred = False
                else:
                    conn.close()
        except DatabaseError:
            conn.connection = None


def backoff(failures: int) -> float:
    return float(min(5.0, 0.1 * 2 ** min(failures, 6)))


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
        ignore_sigint: bool = False,
        parent_pid: int | None = None,
    ) -> None:
        self.queues = list(queues or settings.QUEUES)
        self.batch_size = int(batch_size or settings.BATCH_SIZE)
        self.burst = burst
        self.max_jobs = max_jobs
        self.name = name or make_worker_name()
        self.on_progress = on_progress
        self.handle_signals = handle_signals
        self.ignore_sigint = ignore_sigint
        self.parent_pid = parent_pid
        self.stats = Stats()
        # Read once: these are consulted for every job.
        self._job_timeout = settings.JOB_TIMEOUT
        self._flush_interval = float(settings.FINISH_FLUSH_INTERVAL)
        self._flush_size = int(settings.FINISH_BATCH_SIZE)
        self.stopping = threading.Event()
        self._running: Job | None = None
        self._unstarted: list[Job] = []
        self._pending_done: list[Job] = []
        self._pending_since = 0.0
        # Ids this worker holds (claimed, running or waiting to be recorded): the only
        # leases the heartbeat renews. A claim whose COMMIT reply was lost leaves rows
        # we own without knowing; not renewing them lets them expire and be recovered.
        self._held: set[int] = set()
        self._held_lock = threading.Lock()
        self._cancel_ids: set[int] = set()
        self._heartbeat: threading.Thread | None = None
        # Separate from `stopping`: leases must be renewed until the last job is recorded.
        self._heartbeat_stop = threading.Event()
        self._give_up_at: float | None = None  # set while stopping; see _shutdown()
        self._pauses = PauseWatcher(self.queues)
        self._listener: wakeup.Listener | None = None
        self._listen_retry_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the running job, give back the rest of the batch, then exit."""
        self.stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopping.is_set() and self._running is not None:
            # Second signal: stop the running job now. It is recorded as a failed
            # attempt (and retried), never silently lost.
            raise WorkerShutdown(f"Worker {self.name} was stopped by a second {name}.")
        logger.info(
            "Worker %s: %s received, finishing the current job then exiting",
            self.name,
            name,
            extra=self._extra("worker_stopping"),
        )
        self.stop()

    def _on_cancel(self, signum: int, frame: FrameType | None) -> None:
        job = self._running
        if job is not None and job.id in self._cancel_ids:
            raise JobCancelled(f"Job {job.id} was cancelled by an operator while running.")

    def run(self) -> Stats:
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
            previous[signal.SIGINT] = signal.signal(
                signal.SIGINT, signal.SIG_IGN if self.ignore_sigint else self._on_signal
            )
            previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_cancel)
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
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.warning("Worker %s: supervisor is gone, stopping", self.name)
                break
            try:
                refresh_connections()
                jobs = self._claim()
                failures = 0
            except TRANSIENT_ERRORS as exc:
                failures += 1
                logger.warning(
                    "Worker %s: database error while claiming (%s); retrying in %.1f s",
                    self.name,
                    exc,
                    backoff(failures),
                    extra=self._extra("db_error"),
                )
                refresh_connections()
                self.stopping.wait(backoff(failures))
                continue
            if not jobs:
                self._flush(force=True)
                if self.burst:
                    break
                self._idle(idle_sleep)
                idle_sleep = min(idle_sleep * 2, float(settings.POLL_INTERVAL))
                continue
            idle_sleep = float(settings.MIN_POLL_INTERVAL)
            self._run_batch(jobs)
            self._flush(force=True)

    def _idle(self, poll_sleep: float) -> None:
        """Wait for a wake-up notification, or for the next poll when there is none."""
        now = time.monotonic()
        if self._listener is None and now >= self._listen_retry_at:
            self._listener = wakeup.listen(self.queues)
            self._listen_retry_at = now + 30
        if self._listener is None:
            self.stopping.wait(poll_sleep)
            return
        # Notified workers wake at once; polling every POLL_INTERVAL stays as the safety
        # net (and picks up jobs whose run_after has come). Short slices keep a stop
        # signal from waiting out the whole interval.
        deadline = now + float(settings.POLL_INTERVAL)
        try:
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                if self._listener.wait(min(left, 0.25)):
                    return
        except Exception as exc:
            logger.warning(
                "Worker %s: wake-up listener failed (%s); polling for now",
                self.name,
                exc,
                extra=self._extra("wakeup_error"),
            )
            self._close_listener()

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:  # closing a broken connection may fail again; it is gone
                logger.debug("closing the wake-up listener failed", exc_info=True)
            self._listener = None

    def _claim(self) -> list[Job]:
        limit = self.batch_size
        if self.max_jobs is not None:
            limit = max(1, min(limit, self.max_jobs - self.stats.processed))
        queues = self._pauses.active()
        if not queues:
            return []
        jobs = Job.objects.claim(self.name, limit, queues)
        with self._held_lock:
            self._held.update(job.id for job in jobs)
        return jobs

    def _run_batch(self, jobs: list[Job]) -> None:
        self._unstarted = list(jobs)
        while self._unstarted and not self.stopping.is_set():
            job = self._unstarted.pop(0)
            if job.id in self._cancel_ids:
                self._finish_cancelled(job, "Cancelled by an operator before it started.")
                continue
            self._process(job)
        # Whatever is left in _unstarted is handed back by _shutdown().

    # -- one job -----------------------------------------------------------------------

    def _process(self, job: Job) -> None:
        refresh_connections()
        job.started_at = timezone.now()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Job %s (%s) started", job.id, job.task, extra=self._extra("job_started", job)
            )
        signals.job_started.send(Job, job=job, worker=self.name)
        error: BaseException | None = None
        self._running = job
        try:
            timeout = job.timeout or self._job_timeout
            with time_limit(float(timeout) if timeout else None):
                result = call_job(job)
        except (Exception, JobTimeout, WorkerShutdown, JobCancelled) as exc:
            error = exc
        finally:
            # Before any recording write: a second signal from here on must not raise
            # WorkerShutdown into the worker's own bookkeeping.
            self._running = None
        if error is None:
            job.result = result
            self._pending_done.append(job)
            if len(self._pending_done) == 1:
                self._pending_since = time.monotonic()
            self._flush()
        elif isinstance(error, RetryJob):
            self._retry_later(job, error)
        elif isinstance(error, JobCancelled):
            self._finish_cancelled(job, str(error))
        else:
            self._record_failure(job, error)
            if isinstance(error, WorkerShutdown):
                self.stopping.set()

    def _extra(self, event: str, job: Job | None = None) -> dict[str, Any]:
        """Structured fields for a log record (``logging``'s ``extra``)."""
        fields: dict[str, Any] = {"event": event, "worker": self.name}
        if job is not None:
            fields.update(job_id=job.id, task=job.task, attempt=job.attempts)
        return fields

    def _release(self, *ids: int) -> None:
        with self._held_lock:
            self._held.difference_update(ids)
        self._cancel_ids.difference_update(ids)

    def _record_failure(self, job: Job, exc: BaseException) -> None:
        if isinstance(exc, UnregisteredTask):
            job.max_attempts = job.attempts  # no later attempt can find it: fail it now
        text = "".join(traceback.format_exception(exc))
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        status = self._retry_db(
            lambda: Job.objects.finish_failed_attempt(self.name, job, text, error_class)
        )
        self._release(job.id)
        if status is None:
            logger.warning(
                "Job %s: another worker took it over (lease expired); this "
                "worker's failure is not recorded",
                job.id,
                extra=self._extra("lease_lost", job),
            )
            return
        will_retry = status == Job.Status.QUEUED
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
                extra=self._extra("job_retry", job),
            )
        else:
            self.stats.failed += 1
            logger.error(
                "Job %s (%s) failed after %s attempt(s): %s",
                job.id,
                job.task,
                job.attempts,
                exc,
                extra=self._extra("job_failed", job),
            )
        signals.job_failed.send(
            Job, job=job, worker=self.name, exception=exc, will_retry=will_retry
        )
        self._progress()

    def _retry_later(self, job: Job, exc: RetryJob) -> None:
        done = self._retry_db(lambda: Job.objects.retry_later(self.name, job, exc.delay, str(exc)))
        self._release(job.id)
        if done:
            logger.info(
                "Job %s (%s) asked to run again in %.1f s: %s",
                job.id,
                job.task,
                exc.delay,
                exc,
                extra=self._extra("job_deferred", job),
            )

    def _finish_cancelled(self, job: Job, reason: str) -> None:
        self._retry_db(lambda: Job.objects.cancel_claimed(self.name, job, reason))
        self._release(job.id)
        logger.warning(
            "Job %s (%s): %s",
            job.id,
            job.task,
            reason,
            extra=self._extra("job_cancelled", job),
        )

    def _flush(self, force: bool = False) -> None:
        pending = self._pending_done
        if not pending:
            return
        due = time.monotonic() - self._pending_since >= self._flush_interval
        if not (force or due or len(pending) >= self._flush_size):
            return
        self._pending_done = []
        finished = self._retry_db(lambda: Job.objects.finish_done(self.name, pending))
        self._release(*(job.id for job in pending))
        for job in pending:
            if job.id in finished:
                self.stats.done += 1
                signals.job_finished.send(Job, job=job, worker=self.name, result=job.result)
            else:
                logger.warning(
                    "Job %s finished, but another worker took it over meanwhile "
                    "(lease expired); not recorded twice",
                    job.id,
                    extra=self._extra("lease_lost", job),
                )
        self._progress()

    def _retry_db(self, write: Callable[[], T]) -> T:
        """Run a recording write until the database takes it.

        The writes are guarded by (status=claimed, owner=us), so repeating one that did
        reach the database before the connection broke changes nothing: a job is
        finalized exactly once.
        """
        failures = 0
        while True:
            try:
                return write()
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                    raise
                logger.warning(
                    "Worker %s: database error while recording (%s); retrying in %.1f s",
                    self.name,
                    exc,
                    backoff(failures),
                    extra=self._extra("db_error"),
                )
                refresh_connections()
                time.sleep(backoff(failures))

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.stats)

    # -- registry and heartbeat --------------------------------------------------------

    def _register(self) -> None:
        host, pid = socket.gethostname(), os.getpid()
        self._retry_db(
            lambda: WorkerRow.objects.create(name=self.name, host=host, pid=pid, queues=self.queues)
        )
        logger.info(
            "Worker %s started on queues %s",
            self.name,
            ", ".join(self.queues),
            extra=self._extra("worker_started"),
        )

    def _start_heartbeat(self) -> None:
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, daemon=True, name=f"heartbeat-{self.name}"
        )
        self._heartbeat.start()

    def _heartbeat_loop(self) -> None:
        interval = float(settings.HEARTBEAT_INTERVAL)
        try:
            while not self._heartbeat_stop.wait(interval):
                self.beat()
        finally:
            connections.close_all()

    def beat(self) -> None:
        """Renew our leases, say we are alive, notice cancellations, recover dead workers' jobs."""
        try:
            refresh_connections()
            with self._held_lock:
                held = sorted(self._held)
            now = timezone.now()
            Job.objects.renew_leases(self.name, held)
            WorkerRow.objects.filter(name=self.name).update(
                heartbeat_at=now,
                jobs_done=self.stats.done,
                jobs_failed=self.stats.failed,
            )
            if held:
                self._notice_cancellations(held)
            requeued, failed = Job.objects.recover_expired()
            if requeued:
                wakeup.notify(settings.QUEUES)
            if requeued or failed:
                logger.warning(
                    "Recovered %s job(s) of workers that stopped renewing their "
                    "leases: %s requeued, %s failed (attempts spent)",
                    requeued + failed,
                    requeued,
                    failed,
                    extra=self._extra("jobs_recovered"),
                )
            WorkerRow.objects.filter(heartbeat_at__lt=now - DEAD_WORKER_ROW_TTL).delete()
        except TRANSIENT_ERRORS as exc:
            logger.warning(
                "Worker %s: heartbeat failed (%s); will retry",
                self.name,
                exc,
                extra=self._extra("db_error"),
            )
            refresh_connections()

    def _notice_cancellations(self, held: list[int]) -> None:
        cancelled = Job.objects.cancel_requested_ids(self.name, held) - self._cancel_ids
        if not cancelled:
            return
        self._cancel_ids.update(cancelled)
        running = self._running
        if running is not None and running.id in cancelled and self.handle_signals:
            # Interrupt the main thread: its SIGUSR1 handler raises JobCancelled in the job.
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    def _shutdown(self) -> None:
        self.stopping.set()
        # If the database stays away, give up after a while: whatever we could not
        # record or hand back is recovered by other workers when our leases run out.
        self._give_up_at = time.monotonic() + max(30.0, float(settings.LEASE_TIMEOUT))
        try:
            self._flush(force=True)
            unstarted = [job.id for job in self._unstarted]
            if unstarted:
                given = self._retry_db(lambda: Job.objects.give_back(self.name, unstarted))
                self._release(*unstarted)
                wakeup.notify(self.queues)
                logger.info(
                    "Worker %s: gave back %s unstarted job(s)",
                    self.name,
                    given,
                    extra=self._extra("jobs_given_back"),
                )
            self._unstarted = []
            self._retry_db(lambda: WorkerRow.objects.filter(name=self.name).delete())
        except TRANSIENT_ERRORS as exc:
            logger.error(
                "Worker %s: could not reach the database while stopping (%s); its "
                "jobs will be recovered when their leases expire",
                self.name,
                exc,
            )
        finally:
            self._close_listener()
            self._heartbeat_stop.set()
            if self._heartbeat is not None:
                self._heartbeat.join(timeout=30)
