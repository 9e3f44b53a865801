"""The threaded executor (``run_jobs --threads T``): T jobs at once in one process.

For I/O-bound jobs (HTTP calls, sleeps, slow queries): while one job waits, the others
run. The process's main thread (the worker core) claims and hands out jobs; T executor
threads run them, each with its own database connection (Django's are per thread) and
its own lane in the slot (:mod:`..slots`), so the supervisor sees every running job, its
start and its timeout. A watchdog thread enforces timeouts, cancellations and a second
stop signal by raising the exception in the job's thread (``PyThreadState_SetAsyncExc``):
Python code stops at once, a blocking call when it returns, C code never, and then the
supervisor kills the process past ``KILL_GRACE``, as for ``--threads 1``. What a death
means for the jobs of the other threads is settled in :mod:`..deaths`;
docs/reliability.md says it for users.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connections

from django_dbqueue.exceptions import JobCancelled, JobTimeout, WorkerShutdown
from django_dbqueue.models import Job
from django_dbqueue.worker.deaths import suspect
from django_dbqueue.worker.execution import call_job
from django_dbqueue.worker.executors.base import Executor, Outcome
from django_dbqueue.worker.recording import Recorder

WATCH_INTERVAL = 0.05  # how often the watchdog looks at the running jobs' deadlines


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


class ThreadedExecutor(Executor):
    def __init__(
        self, threads: int, recorder: Recorder, stopping: threading.Event, handle_signals: bool
    ) -> None:
        super().__init__(recorder, stopping, handle_signals)
        self.lanes = threads
        self._lock = threading.Lock()  # the queue and the busy count
        self._changed = threading.Condition(self._lock)  # the core waits on it
        self._work = threading.Condition(self._lock)  # idle threads wait on it
        self._queue: deque[Job] = deque()  # handed over, not started
        self._busy = 0
        self._runs: list[Run | None] = [None] * threads
        self._run_locks = [threading.Lock() for _ in range(threads)]
        self._stop_now: str | None = None  # the second stop signal, once it came
        self._threads: list[threading.Thread] = []
        self._alone = False  # a suspect job runs: no other starts beside it (deaths.py)

    # -- what the core calls -----------------------------------------------------------

    def start(self) -> None:
        super().start()
        watchdog = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
        watchdog.start()
        for lane in range(self.lanes):
            thread = threading.Thread(
                target=self._execute, args=(lane,), name=f"{self.name}-{lane}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, jobs: Sequence[Job]) -> None:
        with self._lock:
            self._queue.extend(jobs)
            self._work.notify(len(jobs))

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def ready_lanes(self, ahead: float) -> int:
        with self._lock:
            if self._alone or (self._queue and suspect(self._queue[0])):
                return 0  # nothing starts beside a suspect job
        return super().ready_lanes(ahead)

    def take_stale(self, since: float) -> list[Job]:
        with self._lock:
            if not self._queue:
                return []
            if self._alone:
                stuck = any(run.started < since for run in self.slot.runs())
            else:
                stuck = self._lanes_stuck(since)
            if not stuck:
                return []
            jobs = list(self._queue)
            self._queue.clear()
        return jobs

    def busy(self) -> bool:
        with self._lock:
            return bool(self._busy or self._queue)

    def running_jobs(self) -> list[Job]:
        return [run.job for run in list(self._runs) if run is not None]

    def wait(self, seconds: float) -> None:
        with self._lock:
            self._changed.wait(seconds)

    def stop_now(self, signal_name: str) -> None:
        self._stop_now = signal_name  # the watchdog raises WorkerShutdown in every job

    def join(self) -> None:
        with self._lock:
            self._work.notify_all()
        for thread in self._threads:
            thread.join()  # each finishes its running job (the supervisor kills a stuck one)

    def unstarted(self) -> list[Job]:
        with self._lock:
            jobs = list(self._queue)
            self._queue.clear()
        return jobs

    # -- the executor threads ----------------------------------------------------------

    def _execute(self, lane: int) -> None:
        try:
            while True:
                with self._lock:
                    while not self._startable() and not self.stopping.is_set():
                        self._work.wait(0.2)
                    if self.stopping.is_set():
                        return  # what is left in the queue is given back when stopping
                    job = self._queue.popleft()
                    self.started += 1
                    alone = self._alone = suspect(job)
                    self._busy += 1
                    self._changed.notify()  # the core may claim more
                try:
                    self.run(job, lane)
                except BaseException as exc:
                    # A recording write that failed for good (or gave up while stopping
                    # with the database away): the process stops, and the job its slot
                    # still shows is settled by the supervisor, as with --threads 1.
                    self.broken = self.broken or exc
                    self.stopping.set()
                    raise
                finally:
                    with self._lock:
                        self._busy -= 1
                        if alone:
                            self._alone = False
                        if alone or (not self._busy and self._queue):
                            self._work.notify_all()  # a suspect job may start, or others
                        self._changed.notify()
                        idle = not self._queue and not self._busy
                    # The last thread going idle writes what finished at once.
                    self.recorder.flush(force=idle)
        finally:
            connections.close_all()  # this thread's own connections

    def _startable(self) -> bool:
        """Can a job start now (the lock held)? Not beside a suspect job: one starts when
        no other runs, and none starts while it runs."""
        if not self._queue or self._alone:
            return False
        return self._busy == 0 or not suspect(self._queue[0])

    def call(self, job: Job, lane: int, timeout: float | None, began: float) -> Outcome:
        run = Run(job, threading.get_ident(), began + timeout if timeout else 0.0, timeout or 0.0)
        outcome: Outcome = (None, None)
        with self._run_locks[lane]:
            self._runs[lane] = run
        try:
            outcome = (call_job(job), None)
        except BaseException as exc:  # a job's SystemExit is its failure, not the worker's
            outcome = (None, exc)
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
        return outcome[0], self._explain(outcome[1], run)

    def _explain(self, error: BaseException | None, run: Run) -> BaseException | None:
        """An interruption raised by the watchdog carries no message: give it one."""
        if error is None or error.args or type(error) is not run.sent:
            return error
        if run.sent is JobTimeout:
            text = f"Job exceeded its timeout of {run.timeout:g} s and was stopped."
        elif run.sent is JobCancelled:
            text = f"Job {run.job.id} was cancelled by an operator while running."
        else:
            text = f"Worker {self.name} was stopped by a second signal ({self._stop_now})."
        return run.sent(text).with_traceback(error.__traceback__)

    # -- the watchdog ------------------------------------------------------------------

    def _watch(self) -> None:
        """Interrupt running jobs past their timeout, cancelled, or told to stop now."""
        while True:
            now = time.monotonic()
            for lane in range(self.lanes):
                with self._run_locks[lane]:
                    run = self._runs[lane]
                    if run is None or run.sent is not None:
                        continue
                    if run.deadline and now >= run.deadline:
                        run.sent = JobTimeout
                    elif self.slot.cancel_running(lane) == run.job.id:
                        run.sent = JobCancelled
                    elif self._stop_now is not None:
                        run.sent = WorkerShutdown
                    else:
                        continue
                    raise_in_thread(run.ident, run.sent)
            if self.stopping.is_set() and not any(t.is_alive() for t in self._threads):
                return
            time.sleep(WATCH_INTERVAL)
