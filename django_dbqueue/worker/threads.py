"""A worker process that runs T jobs at once in threads (``run_jobs --threads T``).

For I/O-bound jobs (HTTP calls, sleeps, slow queries): while one job waits, the others
run. The process's main thread claims and hands out jobs; T executor threads run them,
each with its own database connection (Django's are per thread) and its own lane in the
slot (:mod:`.slots`), so the supervisor sees every running job, its start and its
timeout. A watchdog thread enforces timeouts and cancellations by raising the exception
in the job's thread (``PyThreadState_SetAsyncExc``): Python code stops at once, a
blocking call when it returns, C code never, and then the supervisor kills the process
past ``KILL_GRACE``, as for ``--threads 1``. What a death means for the jobs of the
other threads is settled in :mod:`.deaths`; docs/reliability.md says it for users.

``--threads 1`` does not come here: :class:`~.loop.Worker` runs jobs in its main thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import FrameType
from typing import Any

from django.db import connections

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import JobCancelled, JobTimeout, RetryJob, WorkerShutdown
from django_dbqueue.models import Job
from django_dbqueue.queue.claim import Claimed
from django_dbqueue.worker.connections import refresh_connections
from django_dbqueue.worker.execution import call_job
from django_dbqueue.worker.liveness import wall_time
from django_dbqueue.worker.loop import Worker
from django_dbqueue.worker.slots import Slot, SlotTable

logger = logging.getLogger("django_dbqueue.worker")

WATCH_INTERVAL = 0.05  # how often the watchdog looks at the running jobs' deadlines


def held_capacity(batch_size: int, threads: int) -> int:
    """Held-id entries a threaded child needs: its claims overlap (it claims again while
    jobs of the last claim run) and finished jobs stay held until their batched write."""
    return 2 * batch_size + int(settings.FINISH_BATCH_SIZE) + 2 * threads


def raise_in_thread(ident: int, exc_type: type[BaseException] | None) -> None:
    """Have ``exc_type`` raised in thread ``ident`` at its next Python instruction (None:
    forget one asked for and not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), None if exc_type is None else ctypes.py_object(exc_type)
    )


@dataclass
class Run:
    """A job running in one lane, as its executor thread and the watchdog share it."""

    job: Job
    ident: int
    deadline: float  # time.monotonic(); 0: no timeout
    timeout: float
    sent: type[BaseException] | None = None  # the interruption raised in it, if any


class ThreadedWorker(Worker):
    def __init__(self, threads: int, **options: Any) -> None:
        self.threads = threads
        super().__init__(**options)
        self._lock = threading.RLock()  # the batch, held ids, pending writes, stats
        self._changed = threading.Condition(self._lock)  # the dispatcher waits on it
        self._work = threading.Condition(self._lock)  # idle executors wait on it
        self._queue: deque[Job] = deque()  # claimed, not started
        self._busy = 0
        self._claimed = 0  # jobs claimed in all (for --max-jobs)
        self._free = list(range(self.slot.capacity - 1, -1, -1))  # unused held-id entries
        self._runs: list[Run | None] = [None] * threads
        self._run_locks = [threading.Lock() for _ in range(threads)]
        self._shutdown_now = False
        self._executors: list[threading.Thread] = []
        self._broken: BaseException | None = None  # what ended an executor thread

    def _own_slot(self) -> Slot:
        capacity = held_capacity(self.batch_size, self.threads)
        return SlotTable(1, capacity, lanes=self.threads)[0]

    # -- signals -----------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping.is_set():
            # Second signal: the watchdog raises WorkerShutdown in every running job.
            self._shutdown_now = True
            return
        logger.info(
            "Worker %s: %s received, finishing the running jobs then exiting",
            self.name,
            signal.Signals(signum).name,
            extra=self._extra("worker_stopping"),
        )
        self.stop()

    def _on_cancel(self, signum: int, frame: FrameType | None) -> None:
        """The watchdog reads the slot's cancellations itself; the signal only wakes us."""

    def interrupt(self) -> None:
        """Unsupervised: the watchdog reads the cancellations the heartbeat wrote."""

    # -- the dispatcher (main thread) --------------------------------------------------

    def claim_size(self) -> int:
        """About CLAIM_AHEAD seconds of work for T threads, at least T jobs."""
        if self._claim_ahead <= 0:
            return max(self.threads, self.batch_size)
        if self._job_seconds is None:
            return self.threads
        if self._job_seconds <= 0:
            return max(self.threads, self.batch_size)
        ahead = int(self.threads * self._claim_ahead / self._job_seconds)
        return max(self.threads, min(self.batch_size, ahead))

    def _claim(self) -> Claimed:
        with self._lock:
            if len(self._free) < self.claim_size():
                self._flush(force=True)  # finished jobs hold entries until written
            limit = min(self.claim_size(), len(self._free))
            if self.max_jobs is not None:
                limit = min(limit, self.max_jobs - self._claimed)
        queues = self._pauses.active(self._switched())
        if limit <= 0 or not queues:
            return Claimed()
        jobs = Job.objects.claim(self.name, limit, queues)
        with self._lock:
            for job in jobs:
                index = self._free.pop()
                self.slot.put(index, job.id)
                self._index[job.id] = index
            self._claimed += len(jobs)
        return jobs

    def _release(self, *ids: int) -> None:
        with self._lock:
            for job_id in ids:
                index = self._index.pop(job_id, None)
                if index is not None:
                    self.slot.release(index)
                    self._free.append(index)

    def _wait(self, seconds: float) -> None:
        """Wait for a thread to take or finish a job (or ``seconds``); write finished
        jobs whose batched write is due."""
        with self._lock:
            self._changed.wait(min(seconds, self._flush_interval))
            self._flush()

    def _loop(self) -> None:
        watchdog = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
        watchdog.start()
        for lane in range(self.threads):
            thread = threading.Thread(
                target=self._execute, args=(lane,), name=f"{self.name}-{lane}", daemon=True
            )
            thread.start()
            self._executors.append(thread)
        idle_sleep = float(settings.MIN_POLL_INTERVAL)
        failures = 0
        while not self.stopping.is_set():
            with self._lock:
                waiting, active = len(self._queue), self._busy + len(self._queue)
                spent = self.max_jobs is not None and self._claimed >= self.max_jobs
            if spent:
                if not active:
                    break
                self._wait(0.1)
                continue
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.warning("Worker %s: supervisor is gone, stopping", self.name)
                break
            if waiting >= self.threads:
                self._wait(0.1)
                continue
            jobs, failures = self._claim_or_back_off(failures)
            if jobs is None:
                continue
            if not jobs and jobs.contended:
                continue
            if not jobs:
                if self.burst:
                    if not active:
                        break
                    # Exit once the running jobs are over (or claim what became runnable).
                    self._wait(idle_sleep)
                else:
                    # Nothing runnable: wait for a wake-up or the next poll, as an idle
                    # worker does, whether or not some threads still run a job.
                    with self._lock:
                        self._flush(force=True)
                    self._idle(idle_sleep)
                idle_sleep = min(idle_sleep * 2, float(settings.POLL_INTERVAL))
                continue
            idle_sleep = float(settings.MIN_POLL_INTERVAL)
            with self._lock:
                self._queue.extend(jobs)
                self._work.notify(len(jobs))

    # -- the executors -----------------------------------------------------------------

    def _execute(self, lane: int) -> None:
        try:
            while True:
                with self._lock:
                    while not self._queue and not self.stopping.is_set():
                        self._work.wait(0.2)
                    if self.stopping.is_set():
                        return  # what is left in the queue is given back by _shutdown()
                    job = self._queue.popleft()
                    self._busy += 1
                    self._changed.notify()  # the dispatcher may claim more
                try:
                    refresh_connections()
                    if (
                        self.slot.cancel_requested(job.id)
                        and Job.objects.filter(pk=job.id, cancel_requested=True).exists()
                    ):
                        self._finish_cancelled(job, "Cancelled by an operator before it started.")
                    else:
                        self._run_in(lane, job)
                except BaseException as exc:
                    # A recording write that failed for good (or gave up while stopping
                    # with the database away): the process stops, and the job its slot
                    # still shows is settled by the supervisor, as with --threads 1.
                    self._broken = self._broken or exc
                    self.stopping.set()
                    raise
                finally:
                    with self._lock:
                        self._busy -= 1
                        self._changed.notify()
                        # The last thread going idle writes what finished at once.
                        self._flush(force=not self._queue and not self._busy)
        finally:
            connections.close_all()  # this thread's own connections

    def _run_in(self, lane: int, job: Job) -> None:
        wall = time.time()
        job.note_attempt(wall_time(wall))
        signals.job_started.send(Job, job=job, worker=self.name)
        timeout = float(job.timeout or self._job_timeout or 0)
        began = self.slot.start(job.id, timeout or None, lane, wall=wall)
        run = Run(job, threading.get_ident(), began + timeout if timeout else 0.0, timeout)
        error: BaseException | None = None
        result: Any = None
        with self._run_locks[lane]:
            self._runs[lane] = run
        try:
            result = call_job(job)
        except BaseException as exc:  # a job's SystemExit is its failure, not the worker's
            error = exc
        while True:
            try:
                # No interruption is raised in this thread once its run is gone; one
                # asked for just before is dropped (the job's own outcome stands).
                with self._run_locks[lane]:
                    self._runs[lane] = None
                if run.sent is not None:
                    raise_in_thread(run.ident, None)
                break
            except BaseException:  # the interruption landed on the way out: ignored
                continue
        self.slot.returned(lane)
        duration = time.monotonic() - began
        error = self._explain(error, run)
        with self._lock:
            previous = self._job_seconds
            self._job_seconds = (
                duration if previous is None else previous + (duration - previous) / 8
            )
        if error is None:
            job.result = result
            with self._lock:
                self._done(job)
        elif isinstance(error, RetryJob):
            with self._lock:
                self._retry_later(job, error)
        elif isinstance(error, JobCancelled):
            with self._lock:
                self._finish_cancelled(job, str(error))
        else:
            with self._lock:
                self._record_failure(job, error)
        self.slot.end(lane)

    def _explain(self, error: BaseException | None, run: Run) -> BaseException | None:
        """An interruption raised by the watchdog carries no message: give it one."""
        if error is None or error.args or type(error) is not run.sent:
            return error
        if run.sent is JobTimeout:
            text = f"Job exceeded its timeout of {run.timeout:g} s and was stopped."
        elif run.sent is JobCancelled:
            text = f"Job {run.job.id} was cancelled by an operator while running."
        else:
            text = f"Worker {self.name} was stopped by a second signal."
        return run.sent(text).with_traceback(error.__traceback__)

    # -- the watchdog ------------------------------------------------------------------

    def _watch(self) -> None:
        """Interrupt running jobs past their timeout, cancelled, or told to stop now."""
        while True:
            now = time.monotonic()
            for lane in range(self.threads):
                with self._run_locks[lane]:
                    run = self._runs[lane]
                    if run is None or run.sent is not None:
                        continue
                    if run.deadline and now >= run.deadline:
                        run.sent = JobTimeout
                    elif self.slot.cancel_running(lane) == run.job.id:
                        run.sent = JobCancelled
                    elif self._shutdown_now:
                        run.sent = WorkerShutdown
                    else:
                        continue
                    raise_in_thread(run.ident, run.sent)
            if self.stopping.is_set() and not any(t.is_alive() for t in self._executors):
                return
            time.sleep(WATCH_INTERVAL)

    # -- stopping ----------------------------------------------------------------------

    def _shutdown(self) -> None:
        self.stopping.set()
        with self._lock:
            self._work.notify_all()
        for thread in self._executors:
            thread.join()  # each finishes its running job (the supervisor kills a stuck one)
        self._unstarted = list(self._queue)
        self._queue.clear()
        super()._shutdown()
        if self._broken is not None:
            raise self._broken


def make_worker(threads: int = 1, **options: Any) -> Worker:
    """A worker running ``threads`` jobs at once; one thread: the plain :class:`Worker`."""
    if threads > 1:
        return ThreadedWorker(threads, **options)
    return Worker(**options)
