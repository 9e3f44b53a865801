"""The inline executor (``run_jobs --threads 1``): each job runs in the process's main
thread, one after the other, in claim order.

Its timeout comes from SIGALRM (:func:`~django_dbqueue.worker.execution.time_limit`): it
stops Python code and blocking system calls, and the supervisor kills the process past
``KILL_GRACE`` when C code does not stop. A cancellation (SIGUSR1) and a second stop
signal are raised in the job from their signal handlers, which run in this same thread.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Sequence

from django_dbqueue.exceptions import JobCancelled, WorkerShutdown
from django_dbqueue.models import Job
from django_dbqueue.worker.execution import call_job, time_limit
from django_dbqueue.worker.executors.base import Executor, Outcome
from django_dbqueue.worker.recording import Recorder


class InlineExecutor(Executor):
    lanes = 1

    def __init__(self, recorder: Recorder, stopping: threading.Event, handle_signals: bool):
        super().__init__(recorder, stopping, handle_signals)
        self._running: Job | None = None
        self._unstarted: deque[Job] = deque()
        self._taking = threading.Lock()  # _unstarted: this thread and the timer's

    def submit(self, jobs: Sequence[Job]) -> None:
        """Run the jobs one by one until they are done or the worker is told to stop;
        then write what finished at once, as the process goes idle."""
        self._unstarted = deque(jobs)
        while not self.stopping.is_set():
            with self._taking:
                if not self._unstarted:
                    break
                job = self._unstarted.popleft()
            self.run(job, 0)
        # Whatever is left in _unstarted is handed back when the worker stops.
        self.recorder.flush(force=True)

    def running_jobs(self) -> list[Job]:
        job = self._running
        return [] if job is None else [job]

    def take_stale(self, since: float) -> list[Job]:
        if not self._lanes_stuck(since):
            return []
        with self._taking:
            jobs, self._unstarted = list(self._unstarted), deque()
        return jobs

    def call(self, job: Job, lane: int, timeout: float | None, began: float) -> Outcome:
        self._running = job
        try:
            with time_limit(timeout):
                return call_job(job), None
        except BaseException as exc:  # a job's SystemExit is its failure, not the worker's exit
            return None, exc
        finally:
            # Before any recording write: a second signal from here on must not raise
            # WorkerShutdown into the worker's own bookkeeping.
            self._running = None

    def stop_now(self, signal_name: str) -> None:
        if self._running is not None:
            # It is recorded as a failed attempt (and retried), never silently lost.
            raise WorkerShutdown(
                f"Worker {self.name} was stopped by a second signal ({signal_name})."
            )

    def cancel_signalled(self) -> None:
        job = self._running
        if job is not None and self.slot.cancel_running() == job.id:
            raise JobCancelled(f"Job {job.id} was cancelled by an operator while running.")

    def interrupt(self) -> None:
        if self.handle_signals:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    def unstarted(self) -> list[Job]:
        with self._taking:
            jobs, self._unstarted = list(self._unstarted), deque()
        return jobs
