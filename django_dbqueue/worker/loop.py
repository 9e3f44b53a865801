"""The worker loop: claim a batch, run it, record results, repeat.

One :class:`Worker` runs in one process and writes what it is doing to its slot
(:mod:`.slots`). Under ``run_jobs`` it is a child of a
:class:`~django_dbqueue.worker.supervisor.Supervisor`, which reads the slot to keep the
worker's leases, relay cancellations, stop overrunning jobs and settle what the worker
leaves behind if it dies. Run directly (``Worker(...).run()``), a worker keeps its own
leases from a heartbeat thread (:class:`~django_dbqueue.worker.liveness.HeartbeatThread`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import JobCancelled, RetryJob, UnregisteredTask, WorkerShutdown
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.queue import announce
from django_dbqueue.queue.claim import Claimed
from django_dbqueue.queue.pausing import PauseWatcher
from django_dbqueue.worker import rows, wakeup
from django_dbqueue.worker.connections import (
    TRANSIENT_ERRORS,
    backoff,
    refresh_connections,
    retry_transient,
)
from django_dbqueue.worker.execution import call_job, time_limit
from django_dbqueue.worker.liveness import SHOW_AFTER, HeartbeatThread, recover, wall_time
from django_dbqueue.worker.slots import Slot, SlotTable

logger = logging.getLogger("django_dbqueue.worker")
T = TypeVar("T")


def make_worker_name() -> str:
    return rows.process_name()


@dataclass
class Stats:
    done: int = 0
    failed: int = 0
    retried: int = 0

    @property
    def processed(self) -> int:
        return self.done + self.failed + self.retried


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
        slot: Slot | None = None,
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
        # Given a slot, the worker is a supervisor's child: the supervisor keeps its
        # leases and its row. Otherwise it keeps them itself, from a heartbeat thread.
        self.supervised = slot is not None
        self.slot = slot if slot is not None else self._own_slot()
        self.batch_size = min(self.batch_size, self.slot.capacity)
        self.stats = Stats()
        # Read once: these are consulted for every job.
        self._job_timeout = settings.JOB_TIMEOUT
        self._flush_interval = float(settings.FINISH_FLUSH_INTERVAL)
        self._flush_size = int(settings.FINISH_BATCH_SIZE)
        self._claim_ahead = float(settings.CLAIM_AHEAD)
        # Seconds per job, averaged over recent batches; None until a batch has run.
        self._job_seconds: float | None = None
        self.stopping = threading.Event()
        self._running: Job | None = None
        self._unstarted: list[Job] = []
        self._pending_done: list[Job] = []
        self._pending_since = 0.0
        # Job id -> its entry in the slot's held ids, until the job is recorded. Only
        # those leases are renewed: a claim whose COMMIT reply was lost leaves rows we own
        # without knowing; not renewing them lets them expire and be recovered.
        self._index: dict[int, int] = {}
        self._heartbeat: HeartbeatThread | None = None
        self._give_up_at: float | None = None  # set while stopping; see _shutdown()
        self._pauses = PauseWatcher(self.queues)
        self._listener: wakeup.Listener | None = None
        self._listen_retry_at = 0.0
        self._claim_began = 0.0  # time.monotonic() when the last claim began (see _idle)

    def _own_slot(self) -> Slot:
        """The slot of a worker run unsupervised, where its heartbeat thread reads it."""
        return SlotTable(1, self.batch_size)[0]

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the running job, give back the rest of the batch, then exit."""
        self.stopping.set()

    def interrupt(self) -> None:
        """Cancellation relayed by our own heartbeat thread (unsupervised only)."""
        if self.handle_signals:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

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
        if job is not None and self.slot.cancel_running() == job.id:
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
            if not self.supervised:
                role = WorkerRow.Role.WORKER
                self._retry_db(lambda: rows.register(self.name, os.getpid(), role, self.queues))
                self._retry_db(recover)
                self._heartbeat = HeartbeatThread(self, self._heartbeat_failed)
                self._heartbeat.start()
            logger.info(
                "Worker %s started on queues %s",
                self.name,
                ", ".join(self.queues),
                extra=self._extra("worker_started"),
            )
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
            jobs, failures = self._claim_or_back_off(failures)
            if jobs is None:
                continue
            if not jobs and jobs.contended:
                continue  # other workers took what we saw; there is more: ask again
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

    def _claim_or_back_off(self, failures: int) -> tuple[Claimed | None, int]:
        """One claim, and the count of database errors in a row since the last good one.
        A transient error is logged and waited out here, longer each time: (None, count)."""
        try:
            refresh_connections()
            self._claim_began = time.monotonic()
            return self._claim(), 0
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
            return None, failures

    def _listen(self) -> float:
        """Open the wake-up listener if there is none (retried every 30 s); returns now."""
        now = time.monotonic()
        if self._listener is None and now >= self._listen_retry_at:
            self._listener = wakeup.listen(self.queues)
            self._listen_retry_at = now + 30
        return now

    def _switched(self) -> bool:
        """Was one of our queues paused or resumed since the last claim (as far as the
        wake-up channel says; without one, the PauseWatcher's interval decides)?"""
        self._listen()
        if self._listener is None:
            return False
        try:
            return self._listener.switched()
        except Exception as exc:
            self._listener_failed(exc)
            return True  # it may have missed a pause: read the paused set again

    def _idle(self, poll_sleep: float) -> None:
        """Wait for a wake-up notification, or for the next poll when there is none.

        One announcement may stand for several jobs: a process announces the same queues
        at most once per ``wakeup.COALESCE`` seconds, so a job committed just after an
        announcement goes unannounced. Every worker that heard that announcement begins
        a claim no earlier than ``COALESCE`` after hearing it, which is after such a job
        committed: when the claim that came back empty began before then, one more
        follows at ``heard_at + COALESCE`` (the reasoning is in queue/announce.py,
        "Coalescing"). What counts is when the claim began, not when it returned: its
        reads see what was committed when it began.
        """
        now = self._listen()
        if self._listener is None:
            self.stopping.wait(poll_sleep)
            return
        # Notified workers wake at once; polling every POLL_INTERVAL stays as the safety
        # net (and picks up jobs whose run_after has come). Short slices keep a stop
        # signal from waiting out the whole interval.
        deadline = now + float(settings.POLL_INTERVAL)
        recheck = self._listener.heard_at + wakeup.COALESCE
        if recheck > self._claim_began:
            deadline = min(deadline, recheck)  # in the past: claim again at once
        try:
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                if self._listener.wait(min(left, 0.25)):
                    return
        except Exception as exc:
            self._listener_failed(exc)

    def _listener_failed(self, exc: Exception) -> None:
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

    def claim_size(self) -> int:
        """How many jobs to claim: about CLAIM_AHEAD seconds of them, at most the batch size.

        A process claims only what it can start soon, so jobs it holds are not jobs an
        idle process could run. Before any job has run, the cost is unknown: one job.
        ``CLAIM_AHEAD = 0`` turns this off: every claim asks for the whole batch.
        """
        if self._claim_ahead <= 0:
            return self.batch_size
        if self._job_seconds is None:
            return 1
        if self._job_seconds <= 0:
            return self.batch_size
        return max(1, min(self.batch_size, int(self._claim_ahead / self._job_seconds)))

    def _claim(self) -> Claimed:
        limit = self.claim_size()
        if self.max_jobs is not None:
            limit = max(1, min(limit, self.max_jobs - self.stats.processed))
        queues = self._pauses.active(self._switched())
        if not queues:
            return Claimed()
        jobs = Job.objects.claim(self.name, limit, queues)
        ids = [job.id for job in jobs]
        self.slot.hold(ids)
        self._index = {job_id: index for index, job_id in enumerate(ids)}
        return jobs

    def _run_batch(self, jobs: list[Job]) -> None:
        self._unstarted = list(jobs)
        started = time.monotonic()
        try:
            self._run_jobs()
        finally:
            ran = len(jobs) - len(self._unstarted)
            if ran:
                per_job = (time.monotonic() - started) / ran
                previous = self._job_seconds
                self._job_seconds = per_job if previous is None else (previous + per_job) / 2

    def _run_jobs(self) -> None:
        while self._unstarted and not self.stopping.is_set():
            job = self._unstarted.pop(0)
            # The keeper lists held jobs an operator cancelled; the database has the last
            # word, since the list is only as fresh as the last heartbeat.
            if (
                self.slot.cancel_requested(job.id)
                and Job.objects.filter(pk=job.id, cancel_requested=True).exists()
            ):
                self._finish_cancelled(job, "Cancelled by an operator before it started.")
                continue
            self._process(job)
        # Whatever is left in _unstarted is handed back by _shutdown().

    # -- one job -----------------------------------------------------------------------

    def _process(self, job: Job) -> None:
        refresh_connections()
        wall = time.time()
        job.note_attempt(wall_time(wall))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Job %s (%s) started", job.id, job.task, extra=self._extra("job_started", job)
            )
        signals.job_started.send(Job, job=job, worker=self.name)
        error: BaseException | None = None
        timeout = job.timeout or self._job_timeout
        began = self.slot.start(job.id, float(timeout) if timeout else None, wall=wall)
        self._running = job
        try:
            with time_limit(float(timeout) if timeout else None):
                result = call_job(job)
        except BaseException as exc:  # a job's SystemExit is its failure, not the worker's exit
            error = exc
        finally:
            # Before any recording write: a second signal from here on must not raise
            # WorkerShutdown into the worker's own bookkeeping.
            self._running = None
            self.slot.returned()
        if error is None:
            job.result = result
            # A job that may have been shown as running in our row is recorded before the
            # next one starts: lease recovery relies on it (queue/leases.py, _unstarted).
            self._done(job, now=time.monotonic() - began >= SHOW_AFTER)
        elif isinstance(error, RetryJob):
            self._retry_later(job, error)
        elif isinstance(error, JobCancelled):
            self._finish_cancelled(job, str(error))
        else:
            self._record_failure(job, error)
            if isinstance(error, WorkerShutdown) or (
                isinstance(error, KeyboardInterrupt) and not self.handle_signals
            ):
                # Our own stop signal; or, when we leave signals alone, a Ctrl-C that
                # must still stop an embedded worker (after recording the attempt).
                self.stopping.set()
        self.slot.end()

    def _done(self, job: Job, now: bool = False) -> None:
        """Queue a finished job for the batched write, noting it in the slot first.

        The slot's log lets the supervisor record the job if this process dies before the
        write; a result too big for the log is written at once instead.
        """
        attempt = job.attempt_started_at
        started = attempt.timestamp() if attempt is not None else time.time()
        logged = self.slot.log_done(job.id, started, job.result)
        if not logged and self._pending_done:
            self._flush(force=True)
            logged = self.slot.log_done(job.id, started, job.result)
        self._pending_done.append(job)
        if len(self._pending_done) == 1:
            self._pending_since = time.monotonic()
        self._flush(force=now or not logged)

    def _extra(self, event: str, job: Job | None = None) -> dict[str, Any]:
        """Structured fields for a log record (``logging``'s ``extra``)."""
        fields: dict[str, Any] = {"event": event, "worker": self.name}
        if job is not None:
            fields.update(job_id=job.id, task=job.task, attempt=job.attempts)
        return fields

    def _release(self, *ids: int) -> None:
        for job_id in ids:
            index = self._index.pop(job_id, None)
            if index is not None:
                self.slot.release(index)

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
        self.slot.clear_log()
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
        """Run a recording write until the database takes it (see retry_transient)."""
        return retry_transient(
            write, logger, f"Worker {self.name} while recording", lambda: self._give_up_at
        )

    def _progress(self) -> None:
        stats = self.stats
        self.slot.count(stats.done, stats.failed, stats.retried)
        if self.on_progress is not None:
            self.on_progress(stats)

    def _heartbeat_failed(self, exc: Exception) -> None:
        logger.warning(
            "Worker %s: heartbeat failed (%s); will retry",
            self.name,
            exc,
            extra=self._extra("db_error"),
        )

    def _shutdown(self) -> None:
        self.stopping.set()
        # If the database stays away, give up after a while: whatever we could not
        # record or hand back is settled by the supervisor when we are gone, or recovered
        # when our leases expire.
        self._give_up_at = time.monotonic() + max(30.0, float(settings.LEASE_TIMEOUT))
        try:
            self._flush(force=True)
            unstarted = [job.id for job in self._unstarted]
            if unstarted:
                given = self._retry_db(lambda: Job.objects.give_back(self.name, unstarted))
                self._release(*unstarted)
                announce.notify(self.queues)
                logger.info(
                    "Worker %s: gave back %s unstarted job(s)",
                    self.name,
                    given,
                    extra=self._extra("jobs_given_back"),
                )
            self._unstarted = []
            if not self.supervised:
                self._retry_db(lambda: rows.remove(self.name))
        except TRANSIENT_ERRORS as exc:
            logger.error(
                "Worker %s: could not reach the database while stopping (%s); its "
                "jobs will be recovered when their leases expire",
                self.name,
                exc,
            )
        finally:
            self._close_listener()
            if self._heartbeat is not None:
                self._heartbeat.stop.set()
                self._heartbeat.join(timeout=30)
