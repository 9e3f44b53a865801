"""What every executor shares: the calls the worker core makes, and running one job."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import connections

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import WorkerShutdown
from django_dbqueue.models import Job
from django_dbqueue.worker.connections import refresh_connections
from django_dbqueue.worker.liveness import wall_time
from django_dbqueue.worker.recording import Recorder, log_fields
from django_dbqueue.worker.slots import RUNNING

logger = logging.getLogger("django_dbqueue.worker")

Outcome = tuple[Any, BaseException | None]  # a job's call: (result, None) or (None, error)

# The least time jobs wait for a lane behind jobs that run on before they are handed back
# (Executor.stale_after: twice CLAIM_AHEAD when that is longer).
STALE_AFTER = 0.5


def held_capacity(batch_size: int, threads: int) -> int:
    """Held-id entries a worker process needs. One thread: a batch. More: their claims
    overlap (the process claims again while jobs of the last claim run) and finished jobs
    stay held until their batched write."""
    if threads <= 1:
        return batch_size
    return 2 * batch_size + int(settings.FINISH_BATCH_SIZE) + 2 * threads


class Executor:
    """What the core asks of an executor; :meth:`run` is the one job run both share."""

    lanes = 1  # jobs it runs at once (the slot's lanes)

    def __init__(self, recorder: Recorder, stopping: threading.Event, handle_signals: bool):
        self.recorder = recorder
        self.slot = recorder.slot
        self.name = recorder.name
        self.stopping = stopping
        self.handle_signals = handle_signals
        self.job_timeout = settings.JOB_TIMEOUT  # read once: consulted for every job
        self.broken: BaseException | None = None  # what ended it, raised when the worker stops
        # Jobs wait for a lane at most this long behind jobs that run on (see _timer);
        # CLAIM_AHEAD = 0 (hold whole batches) turns that off.
        ahead = float(settings.CLAIM_AHEAD)
        self.stale_after = max(STALE_AFTER, 2 * ahead) if ahead > 0 else 0.0
        self._timer_thread: threading.Thread | None = None
        self._closing = False
        self.started = 0  # jobs started in all (where they wait to start: threads, loop)

    # -- what the core calls -----------------------------------------------------------

    def start(self) -> None:
        """Get ready to run jobs (start threads): the timer thread, and the executor's own."""
        self._timer_thread = threading.Thread(
            target=self._timer, name=f"{self.name}-timer", daemon=True
        )
        self._timer_thread.start()

    def stop_timer(self) -> None:
        """The worker stops: its own last write follows (Worker._shutdown)."""
        self._closing = True
        self.recorder.wakeup.set()
        if self._timer_thread is not None:
            self._timer_thread.join(timeout=60)

    def ready_lanes(self, ahead: float) -> int:
        """Lanes that can start a job within ``ahead`` seconds: idle ones, and busy ones
        whose job is expected to end by then (jobs take less than ``ahead`` on average and
        this one has not run longer). Claims are sized to these, so that a process whose
        lanes are all taken by long jobs claims nothing for an idle one elsewhere to run."""
        average = self.recorder.job_seconds
        now, ready = time.monotonic(), self.lanes
        for run in self.slot.runs():
            if run.phase == RUNNING and (
                average is None or average > ahead or now - run.started > ahead
            ):
                ready -= 1
        return ready

    def submit(self, jobs: Sequence[Job]) -> None:
        """Run these claimed jobs, or hand them to what runs them."""
        raise NotImplementedError

    def waiting(self) -> int:
        """Jobs handed over and not started yet."""
        return 0

    def started_jobs(self) -> int:
        """Jobs started in all (the core counts those started while it claims)."""
        return self.started

    def busy(self) -> bool:
        """Is any job running or waiting to start?"""
        return False

    def running_jobs(self) -> list[Job]:
        """The jobs whose code runs now (read from another thread: the metrics')."""
        return []

    def wait(self, seconds: float) -> None:
        """Wait for a job to start or end, at most ``seconds``."""
        self.stopping.wait(seconds)

    def stop_now(self, signal_name: str) -> None:
        """A second stop signal: interrupt the running jobs (a failed attempt each)."""
        raise NotImplementedError

    def cancel_signalled(self) -> None:
        """SIGUSR1: the slot marks a running job cancelled."""

    def interrupt(self) -> None:
        """Our own heartbeat thread found a running job cancelled (unsupervised only)."""

    def join(self) -> None:
        """Stopping: let the running jobs end (the supervisor kills one that will not)."""

    def unstarted(self) -> list[Job]:
        """The jobs handed over that never started (given back when the worker stops)."""
        return []

    def take_stale(self, since: float) -> list[Job]:
        """The jobs waiting for a lane, taken back, when every lane has been busy with one
        job since before ``since`` (a time.monotonic()); else none."""
        return []

    def _lanes_stuck(self, since: float) -> bool:
        """Is every lane running a job that started before ``since``?"""
        runs = self.slot.runs()
        return len(runs) == self.lanes and all(
            run.phase == RUNNING and run.started < since for run in runs
        )

    # -- the timer ---------------------------------------------------------------------

    def _timer(self) -> None:
        """The executor's clock, a thread of its own: it writes the done jobs once their
        batched write is due (FINISH_FLUSH_INTERVAL after the first ended), not when a
        lane next ends a job, which may be a minute away; and it hands back the jobs that
        wait behind lanes all busy for longer than ``stale_after``, for an idle process to
        run (a claim is sized to what the lanes should start soon; a long job can still
        surprise it)."""
        wakeup, check = self.recorder.wakeup, max(self.stale_after / 4, 0.05)
        try:
            while not self._closing:
                due = self.recorder.due_in()
                pause = check if due is None else max(0.0, min(due, check))
                self.recorder.timer_wakes_at = time.monotonic() + pause
                wakeup.wait(pause)
                wakeup.clear()
                if self._closing:
                    return
                self.recorder.flush()
                if self.stale_after and not self.stopping.is_set():
                    stale = self.take_stale(time.monotonic() - self.stale_after)
                    if stale:
                        self.recorder.give_back(stale, sorted({job.queue for job in stale}))
        except BaseException as exc:
            # A write that failed for good: the process stops, as when a lane's does.
            self.broken = self.broken or exc
            self.stopping.set()
        finally:
            connections.close_all()  # this thread's own connections

    # -- one job -----------------------------------------------------------------------

    def call(self, job: Job, lane: int, timeout: float | None, began: float) -> Outcome:
        """Call the job's code in this executor's way, stopping it past ``timeout``."""
        raise NotImplementedError

    def run(self, job: Job, lane: int) -> None:
        """One job in ``lane``: the check that it was not cancelled meanwhile, the
        attempt, its lane in the slot, the call, then its outcome recorded."""
        started = self.begin(job, lane)
        if started is not None:
            timeout, began = started
            result, error = self.call(job, lane, timeout, began)
            self.finish(job, lane, result, error, began)

    def begin(self, job: Job, lane: int) -> tuple[float | None, float] | None:
        """Before the call: (its timeout, the time.monotonic() it starts at), or None
        when an operator cancelled it meanwhile (then it is recorded so)."""
        refresh_connections()
        # The keeper lists held jobs an operator cancelled; the database has the last
        # word, since the list is only as fresh as the last heartbeat.
        if (
            self.slot.cancel_requested(job.id)
            and Job.objects.primary().filter(pk=job.id, cancel_requested=True).exists()
        ):
            self.recorder.cancelled(job, "Cancelled by an operator before it started.")
            return None
        wall = time.time()
        job.note_attempt(wall_time(wall))
        if logger.isEnabledFor(logging.DEBUG):
            extra = log_fields("job_started", self.name, job)
            logger.debug("Job %s (%s) started", job.id, job.task, extra=extra)
        signals.job_started.send(Job, job=job, worker=self.name)
        timeout = float(job.timeout or self.job_timeout or 0) or None
        return timeout, self.slot.start(job.id, timeout, lane, wall=wall)

    def finish(
        self, job: Job, lane: int, result: Any, error: BaseException | None, began: float
    ) -> None:
        """After the call: the outcome recorded, the lane freed."""
        ran = time.monotonic() - began
        # From here on, no interruption reaches the worker's own bookkeeping.
        self.slot.returned(lane)
        self.recorder.note_time(ran)
        self.recorder.record(job, result, error, ran)
        if isinstance(error, WorkerShutdown) or (
            isinstance(error, KeyboardInterrupt) and not self.handle_signals
        ):
            # Our own stop signal; or, when we leave signals alone, a Ctrl-C that must
            # still stop an embedded worker (after recording the attempt).
            self.stopping.set()
        self.slot.end(lane)
