"""The asyncio executor (``run_jobs --async-concurrency A``): a worker process's
``async def`` jobs side by side on one event loop, its other jobs as before.

It wraps the process's sync executor (inline or threaded), which keeps lanes 0..T-1
and runs every job whose task is not an ``async def``. The ``async def`` jobs get the
next A lanes of the slot and run as tasks of an event loop in a thread of their own,
so the supervisor sees each one, its start and its deadline, as it sees a thread's.

What each job does outside its own code (the cancel check, the attempt, the recording)
is the blocking :meth:`.base.Executor.begin` and :meth:`.base.Executor.finish`, run in one
bookkeeping thread (with its own database connection), never on the loop. A timeout is
``asyncio.timeout``: the job's task is cancelled at its deadline and the attempt fails
with :class:`JobTimeout`. An operator's cancellation and a second stop signal cancel
the task too (a watchdog coroutine reads the slot), and the attempt ends as
:class:`JobCancelled` or :class:`WorkerShutdown`. A coroutine that blocks the loop
(``time.sleep``, CPU work) holds up every async job of the process; past its deadline
and ``KILL_GRACE`` the supervisor kills the process, and what that means for the jobs of
the other lanes is settled in :mod:`..deaths`, as for threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connections

from django_dbqueue.exceptions import JobCancelled, JobTimeout, WorkerShutdown
from django_dbqueue.models import Job
from django_dbqueue.worker.execution import acall_job, runs_async
from django_dbqueue.worker.executors.base import Executor, Outcome
from django_dbqueue.worker.recording import Recorder

logger = logging.getLogger("django_dbqueue.worker")
T = TypeVar("T")

WATCH_INTERVAL = 0.05  # how often the watchdog looks for cancellations and stop signals


@dataclass
class Run:
    """An async job in one lane, as its task and the watchdog share it."""

    job: Job
    task: asyncio.Task[None] | None = None
    calling: bool = False  # its code is running (only then is it interrupted)
    sent: type[BaseException] | None = None  # the interruption asked for, if any


class AsyncioExecutor(Executor):
    def __init__(
        self,
        inner: Executor,
        concurrency: int,
        recorder: Recorder,
        stopping: threading.Event,
        handle_signals: bool,
    ) -> None:
        super().__init__(recorder, stopping, handle_signals)
        self.inner = inner
        self.lanes = inner.lanes + concurrency
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the core waits on it
        self._queue: deque[Job] = deque()  # async jobs handed over, not started
        self._free = list(range(self.lanes - 1, inner.lanes - 1, -1))  # lowest last
        self._runs: dict[int, Run] = {}  # lane -> its job
        self._stop_now: str | None = None
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=f"{self.name}-asyncio")
        self._thread.daemon = True
        self._books = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-records")

    # -- what the core calls -----------------------------------------------------------

    def start(self) -> None:
        self.inner.start()
        self._thread.start()

    def stop_timer(self) -> None:
        # The timer is the inner executor's (it started it): stopped with the worker.
        self.inner.stop_timer()

    def submit(self, jobs: Sequence[Job]) -> None:
        """Async jobs to the loop, the others to the sync executor (the inline one runs
        them here and now, while the loop runs the async ones)."""
        on_loop: list[Job] = []
        plain: list[Job] = []
        for job in jobs:
            (on_loop if runs_async(job) else plain).append(job)
        if on_loop:
            with self._lock:
                self._queue.extend(on_loop)
            self._loop.call_soon_threadsafe(self._start_queued)
        if plain:
            self.inner.submit(plain)

    def waiting(self) -> int:
        with self._lock:
            return self.inner.waiting() + len(self._queue)

    def started_jobs(self) -> int:
        return self.inner.started_jobs() + self.started

    def busy(self) -> bool:
        with self._lock:
            mine = bool(self._queue or self._runs)
        return mine or self.inner.busy()

    def running_jobs(self) -> list[Job]:
        with self._lock:
            mine = [run.job for run in self._runs.values() if run.calling]
        return self.inner.running_jobs() + mine

    def wait(self, seconds: float) -> None:
        if self.inner.busy():
            seconds = min(seconds, WATCH_INTERVAL)  # the threads' ends notify their own
        with self._lock:
            self._changed.wait(seconds)

    def stop_now(self, signal_name: str) -> None:
        self._stop_now = signal_name  # the watchdog cancels every async job
        self.inner.stop_now(signal_name)

    def cancel_signalled(self) -> None:
        self.inner.cancel_signalled()  # async jobs: the watchdog reads the slot

    def interrupt(self) -> None:
        self.inner.interrupt()

    def join(self) -> None:
        self.inner.join()
        with self._lock:
            while self._runs:  # each ends its job (the supervisor kills a stuck loop)
                self._changed.wait(0.2)
        self._closing = True
        if self._thread.ident is None:  # the worker stopped before it started
            self._loop.close()
        else:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._books.submit(connections.close_all).result()  # that thread's connection
        self._books.shutdown()

    def unstarted(self) -> list[Job]:
        with self._lock:
            jobs = list(self._queue)
            self._queue.clear()
        return self.inner.unstarted() + jobs

    # -- the loop's thread -------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        watchdog = self._loop.create_task(self._watch())
        while not self._closing:
            try:
                self._loop.run_forever()
            except BaseException:
                # A task a job started itself raised SystemExit or KeyboardInterrupt,
                # which asyncio lets out of the loop: the other jobs go on.
                logger.exception("Worker %s: a job's task escaped its job", self.name)
        watchdog.cancel()
        self._loop.run_until_complete(asyncio.gather(watchdog, return_exceptions=True))
        self._loop.close()

    def _start_queued(self) -> None:
        with self._lock:
            while self._queue and self._free and not self.stopping.is_set():
                lane = self._free.pop()
                run = self._runs[lane] = Run(self._queue.popleft())
                self.started += 1
                run.task = self._loop.create_task(self._run(run, lane))
            self._changed.notify_all()

    async def _in_books(self, func: Callable[..., T], *args: Any) -> T:
        """Call blocking bookkeeping (database writes) in the bookkeeping thread."""
        return await self._loop.run_in_executor(self._books, func, *args)

    async def _run(self, run: Run, lane: int) -> None:
        """One async job: begin, its code, finish; then the lane goes to the next."""
        try:
            started = await self._in_books(self.begin, run.job, lane)
            if started is not None:
                timeout, began = started
                result, error = await self._call(run, timeout)
                await self._in_books(self.finish, run.job, lane, result, error, began)
            with self._lock:
                last = len(self._runs) == 1 and not self._queue
            await self._in_books(self.recorder.flush, last)  # the last one writes at once
        except BaseException as exc:
            # A recording write that failed for good: the process stops, and the job
            # its slot still shows is settled by the supervisor, as for threads.
            self.broken = self.broken or exc
            self.stopping.set()
        finally:
            with self._lock:
                del self._runs[lane]
                self._free.append(lane)
                self._changed.notify_all()
            self._start_queued()

    async def _call(self, run: Run, timeout: float | None) -> Outcome:
        """Await the job's code, cancelled at ``timeout`` or when the watchdog asks."""
        limit = asyncio.timeout(timeout)
        run.calling = True
        try:
            async with limit:
                return await acall_job(run.job), None
        except BaseException as exc:  # a job's SystemExit is its failure, not the worker's
            return None, self._explain(exc, run, limit, timeout)
        finally:
            run.calling = False

    def _explain(
        self, error: BaseException, run: Run, limit: asyncio.Timeout, timeout: float | None
    ) -> BaseException:
        """The cancellation of the job's task, told as what asked for it."""
        if isinstance(error, asyncio.CancelledError) and run.sent is not None:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # ours, and handled: the task goes on to record it
            if run.sent is JobCancelled:
                text = f"Job {run.job.id} was cancelled by an operator while running."
            else:
                text = f"Worker {self.name} was stopped by a second signal ({self._stop_now})."
            return run.sent(text).with_traceback(error.__traceback__)
        if isinstance(error, TimeoutError) and limit.expired():
            text = f"Job exceeded its timeout of {timeout or 0:g} s and was stopped."
            return JobTimeout(text).with_traceback(error.__traceback__)
        return error

    async def _watch(self) -> None:
        """Cancel the async jobs an operator cancelled, or all of them on a second
        stop signal."""
        while True:
            with self._lock:
                runs = list(self._runs.items())
            for lane, run in runs:
                if not run.calling or run.sent is not None or run.task is None:
                    continue
                if self.slot.cancel_running(lane) == run.job.id:
                    run.sent = JobCancelled
                elif self._stop_now is not None:
                    run.sent = WorkerShutdown
                else:
                    continue
                run.task.cancel()
            await asyncio.sleep(WATCH_INTERVAL)
