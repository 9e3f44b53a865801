"""The worker core: claim jobs, hand them to an executor, repeat; one loop for every mode.

One :class:`Worker` runs in one process. It claims about ``CLAIM_AHEAD`` seconds of jobs
at a time and hands them to its executor (:mod:`.executors`): the inline one runs them
in this thread (``run_jobs --threads 1``), the threaded one in T threads. Whatever a job
came to is written by the :class:`~.recording.Recorder`, the one place that records;
waiting for a wake-up between claims is :class:`~.listening.Listening`'s.

Under ``run_jobs`` the worker is a child of a
:class:`~django_dbqueue.worker.supervisor.Supervisor`, which reads its slot (:mod:`.slots`)
to keep its leases, relay cancellations, stop overrunning jobs and settle what it leaves
behind if it dies. Run directly (``Worker(...).run()``), a worker keeps its own leases
from a heartbeat thread (:class:`~django_dbqueue.worker.liveness.HeartbeatThread`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.observability import hooks
from django_dbqueue.queue.claim import Claimed
from django_dbqueue.queue.pausing import PauseWatcher
from django_dbqueue.worker import rows
from django_dbqueue.worker.connections import (
    TRANSIENT_ERRORS,
    DatabaseWaits,
    refresh_connections,
)
from django_dbqueue.worker.executors import make_executor
from django_dbqueue.worker.executors.base import held_capacity
from django_dbqueue.worker.handout import Handout, contended_pause
from django_dbqueue.worker.listening import Listening
from django_dbqueue.worker.liveness import HeartbeatThread, recover
from django_dbqueue.worker.recording import Recorder, Stats, log_fields
from django_dbqueue.worker.slots import Slot, SlotTable
from django_dbqueue.worker.wakeup import Listener

logger = logging.getLogger("django_dbqueue.worker")

OUTLAST_DECAY = 0.9  # the jobs a claim must outlast, kept from claim to claim (_note_claim)

# A supervisor starts its children with these blocked (supervisor.py, _spawn), so that one
# sent while a child starts waits for the child's handlers instead of killing it.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}


def make_worker_name() -> str:
    return rows.process_name()


class StopEvent(threading.Event):
    """The worker's ``stopping``: an Event that its own signal handler may set.

    A handler runs in the main thread between two bytecodes, maybe while that thread
    holds this Event's lock inside ``wait()`` (a plain Event's lock then deadlocks the
    handler, which waits for itself). On a re-entrant lock the handler goes through; a
    wait it overlapped that way ends at its timeout, and every wait here has one.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


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
        threads: int = 1,
        async_concurrency: int = 0,
        handout: Handout | None = None,
        wakeup: Listener | None = None,
    ) -> None:
        self.queues = list(queues or settings.QUEUES)
        self.batch_size = int(batch_size or settings.BATCH_SIZE)
        self.burst = burst
        self.max_jobs = max_jobs
        self.name = name or make_worker_name()
        self.handle_signals = handle_signals
        self.ignore_sigint = ignore_sigint
        self.parent_pid = parent_pid
        # Given a slot, the worker is a supervisor's child: the supervisor keeps its
        # leases and its row. Otherwise it keeps them itself, from a heartbeat thread.
        self.supervised = slot is not None
        if slot is None:
            lanes = threads + async_concurrency
            slot = SlotTable(1, held_capacity(self.batch_size, lanes), lanes=lanes)[0]
        self.slot = slot
        self.batch_size = min(self.batch_size, slot.capacity)
        self.stopping: threading.Event = StopEvent()
        self._stopped_by = ""  # the stop signal's name, for the log line (_shutdown)
        self.recorder = Recorder(self.name, slot, on_progress)
        self.stats = self.recorder.stats
        self.executor = make_executor(
            threads, self.recorder, self.stopping, handle_signals, async_concurrency
        )
        # A supervisor's child hears the supervisor's listener (worker/relay.py).
        self.listening = Listening(self.name, self.queues, self.stopping, wakeup)
        self._pauses = PauseWatcher(self.queues)
        self._claim_ahead = float(settings.CLAIM_AHEAD)  # read once: consulted every claim
        self._claimed = 0  # jobs claimed in all (for max_jobs)
        self._outlast = 0  # claim again before fewer jobs wait than this (_note_claim)
        self._fed = False  # the last claim brought jobs
        self._claim_waits = DatabaseWaits(
            f"Worker {self.name} claiming", logger, self.name, where="claim"
        )
        self._heartbeat: HeartbeatThread | None = None
        # A supervisor's child of many: the supervisor claims for it (worker/handout.py).
        self._handout = handout

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the running jobs, give back the rest of what was claimed, then exit."""
        self.stopping.set()

    def interrupt(self) -> None:
        """Cancellation relayed by our own heartbeat thread (unsupervised only)."""
        self.executor.interrupt()

    def run(self) -> Stats:
        previous = self._install_signals()
        try:
            self._start()
            self._loop()
        finally:
            self._shutdown()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.stats

    def _install_signals(self) -> dict[signal.Signals, Any]:
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
            previous[signal.SIGINT] = signal.signal(
                signal.SIGINT, signal.SIG_IGN if self.ignore_sigint else self._on_signal
            )
            previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_cancel)
        if self.supervised:
            # A stop sent while we started is delivered now, to the handler.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return previous

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only what is safe in a handler: no lock the main thread may hold, no logging
        # (a stream it was writing to refuses a re-entrant write). _shutdown logs it.
        # Under a supervisor, the signal run_jobs got (it passes every stop on as SIGTERM).
        name = signal.Signals(self.slot.stop_signal() or signum).name
        if self.stopping.is_set():
            self.executor.stop_now(name)  # second signal: stop the running jobs now
            return
        self._stopped_by = name
        self.stop()

    def _on_cancel(self, signum: int, frame: FrameType | None) -> None:
        self.executor.cancel_signalled()

    def _start(self) -> None:
        if not self.supervised:
            role = WorkerRow.Role.WORKER
            self.recorder.retry(lambda: rows.register(self.name, os.getpid(), role, self.queues))
            self.recorder.retry(recover)
            self._heartbeat = HeartbeatThread(self)
            self._heartbeat.start()
        self.executor.start()
        hooks.watch(self.executor.running_jobs, self.queues)  # the metrics' running gauge
        logger.info(
            "Worker %s started on queues %s",
            self.name,
            ", ".join(self.queues),
            extra=log_fields("worker_started", self.name),
        )

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        idle_sleep, failures, contended = float(settings.MIN_POLL_INTERVAL), 0, 0
        while not self.stopping.is_set():
            if (
                self.max_jobs is not None
                and self._claimed - self.recorder.handed_back >= self.max_jobs
            ):
                if not self.executor.busy():
                    break
                self._wait(0.1)
                continue
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.warning("Worker %s: supervisor is gone, stopping", self.name)
                break
            wanted = self._wanted()
            if not wanted:
                self._wait(0.1)  # claim when a lane takes one or frees up
                continue
            jobs, failures = self._claim_or_back_off(failures, wanted)
            if jobs is None:
                continue  # an error waited out: ask again
            contended = contended + 1 if jobs.contended else 0
            if contended:
                # Others took what we saw: ask again after a jittered pause, not at once.
                self.stopping.wait(contended_pause(contended))
                continue
            if jobs:
                idle_sleep = float(settings.MIN_POLL_INTERVAL)
                self.executor.submit(jobs)
                continue
            if self.burst and self.executor.busy():
                self._wait(idle_sleep)  # exit once they end, or claim what became runnable
            else:
                self.recorder.flush(force=True)
                if self.burst:
                    break
                self.listening.idle(idle_sleep)  # a wake-up, or the next poll
            idle_sleep = min(idle_sleep * 2, float(settings.POLL_INTERVAL))

    def _wait(self, seconds: float) -> None:
        """Wait for the executor to start or end a job (or ``seconds``); write finished
        jobs whose batched write is due."""
        self.executor.wait(min(seconds, self.recorder.flush_interval))
        self.recorder.flush()

    def _wanted(self) -> int:
        """How many jobs to claim now. None while the jobs waiting here keep every lane
        going and outlast a claim (see _note_claim); else what the lanes that can start a
        job within CLAIM_AHEAD (Executor.ready_lanes) start in that time, less those
        waiting, at most a batch. A process whose lanes all run long jobs claims nothing:
        what it claimed would wait here while another process or thread may be idle."""
        waiting = self.executor.waiting()
        if waiting >= self.executor.lanes and waiting > self._outlast:
            return 0
        ready = self.executor.ready_lanes(self._claim_ahead)
        if not ready:
            return 0
        return max(0, int(min(self.batch_size + waiting, self._within_ahead(ready)) - waiting))

    def _claim_or_back_off(self, failures: int, wanted: int) -> tuple[Claimed | None, int]:
        """One claim, and the count of database errors in a row since the last good one.
        A transient error is logged and waited out here, longer each time: (None, count)."""
        try:
            refresh_connections()
            self.listening.claim_began = time.monotonic()
            claimed = self._claim(wanted)
        except TRANSIENT_ERRORS as exc:
            pause = self._claim_waits.failed(exc)
            refresh_connections()
            self.stopping.wait(pause)
            return None, failures + 1
        self._claim_waits.succeeded()
        return claimed, 0

    def claim_size(self, lanes: int | None = None) -> int:
        """How many jobs to claim for ``lanes`` idle lanes (default: all the executor's):
        about CLAIM_AHEAD seconds of them, at most the batch size and at least a job per
        lane.

        A process claims only what it can start soon, so jobs it holds are not jobs an
        idle process could run. Before any job has run, the cost is unknown: a job per
        lane. ``CLAIM_AHEAD = 0`` turns this off: every claim asks for the whole batch.
        """
        lanes = self.executor.lanes if lanes is None else lanes
        return max(lanes, int(min(self.batch_size, self._within_ahead(lanes))))

    def _within_ahead(self, lanes: int) -> float:
        """Jobs ``lanes`` lanes start within CLAIM_AHEAD (unbounded when it is 0)."""
        seconds = self.recorder.job_seconds
        if self._claim_ahead <= 0 or (seconds is not None and seconds <= 0):
            return math.inf
        if seconds is None:
            return lanes
        return max(lanes, lanes * self._claim_ahead / seconds)

    def _note_claim(self, waiting: int, started: int, fed: bool) -> None:
        """A claim came back, ``started`` jobs after it went out with ``waiting`` jobs
        waiting here (``fed``: the claim before it brought jobs). With threads or
        coroutines the lanes run on while the core claims: the next claim goes out
        before fewer jobs wait than started during this one, so that the lanes do not
        run dry waiting for it. A claim that found none left, or none to begin with
        after the last claim's jobs, came too late: the estimate doubles. It decays
        slowly. (The core may be slow to look: busy lanes hold the GIL.)"""
        if started >= waiting and (waiting or fed):
            started = max(2 * started, self.executor.lanes, 2 * self._outlast)
        self._outlast = min(self.batch_size, max(started, int(self._outlast * OUTLAST_DECAY)))

    def _claim(self, wanted: int) -> Claimed:
        if self.max_jobs is not None:
            wanted = min(wanted, self.max_jobs - self._claimed + self.recorder.handed_back)
        if self.recorder.room() < wanted:
            self.recorder.flush(force=True)  # finished jobs hold entries until written
        limit = min(wanted, self.recorder.room())
        queues = self._pauses.active(self.listening.switched())
        if limit <= 0 or not queues:
            return Claimed()
        waiting, started = self.executor.waiting(), self.executor.started_jobs()
        if self._handout is not None:
            jobs = self._handout.claim(self.name, limit, queues)
        else:
            jobs = Job.objects.claim(self.name, limit, queues)
        self._note_claim(waiting, self.executor.started_jobs() - started, self._fed)
        self._fed = bool(jobs)
        self.recorder.hold(jobs)
        self._claimed += len(jobs)
        return jobs

    # -- stopping ----------------------------------------------------------------------

    def _shutdown(self) -> None:
        self.stopping.set()
        if self._stopped_by:
            logger.info(
                "Worker %s: %s received, finishing the running job(s) then exiting",
                self.name,
                self._stopped_by,
                extra=log_fields("worker_stopping", self.name),
            )
        self.executor.join()
        # If the database stays away, give up after a while: whatever we could not
        # record or hand back is settled by the supervisor when we are gone, or recovered
        # when our leases expire.
        self.recorder.give_up_at = time.monotonic() + max(30.0, float(settings.LEASE_TIMEOUT))
        self.executor.stop_timer()
        try:
            self.recorder.flush(force=True)
            self.recorder.give_back(self.executor.unstarted(), self.queues)
            if not self.supervised:
                self.recorder.retry(lambda: rows.remove(self.name))
        except TRANSIENT_ERRORS as exc:
            logger.error(
                "Worker %s: could not reach the database while stopping (%s); its "
                "jobs will be recovered when their leases expire",
                self.name,
                exc,
            )
        finally:
            hooks.unwatch(self.executor.running_jobs, self.queues)
            self.listening.close()
            if self._heartbeat is not None:
                self._heartbeat.stop.set()
                self._heartbeat.join(timeout=30)
        if self.executor.broken is not None:
            raise self.executor.broken


def make_worker(threads: int = 1, **options: Any) -> Worker:
    """A worker running ``threads`` jobs at once (one: each job in the main thread)."""
    return Worker(threads=threads, **options)
