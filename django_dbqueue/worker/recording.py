"""Recording what became of each job a worker process ran: the one place for it.

A :class:`Recorder` writes every outcome (the batched finish of done jobs, failed
attempts, retries asked for by the job, cancellations, the jobs given back when the
worker stops), keeps the slot's held ids (:mod:`.slots`: only the leases of jobs not yet
recorded are renewed), the counts, the signals and the log lines. Both executors
(:mod:`.executors`) record through it: the inline one from the process's main thread,
the threaded one from each of its threads, so every method takes the recorder's lock.

Done jobs are written in batches (``FINISH_BATCH_SIZE`` jobs, or ``FINISH_FLUSH_INTERVAL``
after the first of them, by the executor's timer thread whatever the lanes are running,
or at once when the executor goes idle), each with its own start and end times, noted
when its code started and returned. Until its write each one is noted in the slot's done
log, so the supervisor records it if the process dies first (:mod:`.deaths`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import JobCancelled, RetryJob, UnregisteredTask
from django_dbqueue.models import Job
from django_dbqueue.observability import hooks
from django_dbqueue.queue import announce
from django_dbqueue.worker.connections import retry_transient
from django_dbqueue.worker.liveness import SHOW_AFTER, wall_time
from django_dbqueue.worker.slots import Slot

logger = logging.getLogger("django_dbqueue.worker")
T = TypeVar("T")

# The weight of the newest job in the running average of job time (see note_time).
NEWEST_WEIGHT = 1 / 8


@dataclass
class Stats:
    done: int = 0
    failed: int = 0
    retried: int = 0

    @property
    def processed(self) -> int:
        return self.done + self.failed + self.retried


def log_fields(event: str, worker: str, job: Job | None = None) -> dict[str, Any]:
    """Structured fields for a log record (``logging``'s ``extra``)."""
    fields: dict[str, Any] = {"event": event, "worker": worker}
    if job is not None:
        fields.update(job_id=job.id, task=job.task, attempt=job.attempts)
    return fields


class Recorder:
    def __init__(
        self, name: str, slot: Slot, on_progress: Callable[[Stats], None] | None = None
    ) -> None:
        self.name = name
        self.slot = slot
        self.on_progress = on_progress
        self.stats = Stats()
        self.lock = threading.RLock()
        # While stopping: give up a write the database does not take by then (see
        # retry_transient); what is left is settled by the supervisor or lease recovery.
        self.give_up_at: float | None = None
        # Read once: these are consulted for every job.
        self.flush_interval = float(settings.FINISH_FLUSH_INTERVAL)
        self._flush_size = int(settings.FINISH_BATCH_SIZE)
        # Only a one-lane slot's running job is shown in the worker's row (liveness.py,
        # show_slow_jobs); lease recovery relies on it being recorded before the next.
        self._shows_running = slot.lanes == 1
        # Seconds a job's code runs, averaged (note_time); None until a job has run.
        self.job_seconds: float | None = None
        self._warming = slot.lanes  # first runs, one a lane, not averaged (note_time)
        self._pending: list[Job] = []
        # Each pending job's start and run time, for the metrics (hooks.ended).
        self._pending_started: list[datetime] = []
        self._pending_ran: list[float] = []
        self._pending_since = 0.0
        # Set when a done job starts a batch the executor's timer (executors/base.py)
        # would otherwise look at too late: it writes the batch once due, whatever the
        # lanes are doing by then. The timer notes when it wakes next anyway
        # (time.monotonic()); a wake-up for every batch cost a thread switch each.
        self.wakeup = threading.Event()
        self.timer_wakes_at = 0.0
        self.handed_back = 0  # claimed jobs given back unstarted (they do not count as run)
        # Job id -> its entry in the slot's held ids, until the job is recorded. Only
        # those leases are renewed: a claim whose COMMIT reply was lost leaves rows we own
        # without knowing; not renewing them lets them expire and be recovered.
        self._index: dict[int, int] = {}
        self._free = list(range(slot.capacity - 1, -1, -1))  # unused entries, lowest last

    # -- held ids ----------------------------------------------------------------------

    def room(self) -> int:
        """How many more jobs the slot can hold now."""
        with self.lock:
            return len(self._free)

    def hold(self, jobs: Sequence[Job]) -> None:
        """Claimed jobs: held (their leases renewed) until each is recorded."""
        with self.lock:
            for job in jobs:
                index = self._free.pop()
                self.slot.put(index, job.id)
                self._index[job.id] = index

    def _release(self, *ids: int) -> None:
        for job_id in ids:
            index = self._index.pop(job_id, None)
            if index is not None:
                self.slot.release(index)
                self._free.append(index)

    # -- outcomes ----------------------------------------------------------------------

    def note_time(self, seconds: float) -> None:
        """A job's code ran ``seconds``: the running average the claim size is made of.

        An exponentially weighted average, each job one sample of weight 1/8: it follows
        a change of job mix within a few dozen jobs, one outlier moves it by an eighth,
        and it weighs jobs alike whether they came one or a hundred to a claim, and
        whichever lane ran them. The job's own run, not the recording around it: that
        cost is the worker's, paid in batches, and waits for the recorder's lock would
        count one flush once per thread.

        The first job of each lane is left out: it pays for what warms up in a new
        process (lazy imports and caches, a core other new processes want too). A no-op
        took 25 to 90 ms so, then 15 to 50 us; averaged in, it held each child of a host
        of 16 to claims of a few jobs for the first 3 seconds of a drain.
        """
        with self.lock:
            if self._warming > 0:
                self._warming -= 1
                return
            previous = self.job_seconds
            if previous is None:
                self.job_seconds = seconds
            else:
                self.job_seconds = previous + (seconds - previous) * NEWEST_WEIGHT

    def record(self, job: Job, result: Any, error: BaseException | None, ran: float) -> None:
        """What a job's call came to (``ran``: seconds its code ran), written or queued."""
        if error is None:
            job.result = result
            # A job that may have been shown as running in our row is recorded before
            # the next one starts: lease recovery relies on it (queue/leases.py).
            self.done(job, ran, now=self._shows_running and ran >= SHOW_AFTER)
            return
        if isinstance(error, RetryJob):
            self.retry_later(job, error)
        elif isinstance(error, JobCancelled):
            self.cancelled(job, str(error))
        else:
            self.failed(job, error)
        hooks.ended([job], [job.attempt_started_at or wall_time(time.time())], [ran], ())

    def done(self, job: Job, ran: float, now: bool = False) -> None:
        """Queue a finished job (whose code ran ``ran`` seconds) for the batched write,
        noting it in the slot first.

        The slot's log lets the supervisor record the job if this process dies before the
        write; a result too big for the log is written at once instead.
        """
        ended = time.time()
        job.finished_at = wall_time(ended)  # the job's own end, whenever it is written
        attempt = job.attempt_started_at or job.finished_at
        started = attempt.timestamp()
        with self.lock:
            logged = self.slot.log_done(job.id, started, ended, job.result)
            if not logged and self._pending:
                self.flush(force=True)
                logged = self.slot.log_done(job.id, started, ended, job.result)
            self._pending.append(job)
            self._pending_started.append(attempt)
            self._pending_ran.append(ran)
            if len(self._pending) == 1:
                self._pending_since = time.monotonic()
                if self.timer_wakes_at > self._pending_since + self.flush_interval:
                    self.wakeup.set()  # the timer writes the batch when it is due
            self.flush(force=now or not logged)

    def failed(self, job: Job, exc: BaseException) -> None:
        if isinstance(exc, UnregisteredTask):
            job.max_attempts = job.attempts  # no later attempt can find it: fail it now
        text = "".join(traceback.format_exception(exc))
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        with self.lock:
            status = self.retry(
                lambda: Job.objects.finish_failed_attempt(self.name, job, text, error_class)
            )
            self._release(job.id)
            if status is None:
                logger.warning(
                    "Job %s: another worker took it over (lease expired); this "
                    "worker's failure is not recorded",
                    job.id,
                    extra=log_fields("lease_lost", self.name, job),
                )
                return
            will_retry = status == Job.Status.QUEUED
            self._count_failure(job, exc, will_retry)
            signals.job_failed.send(
                Job, job=job, worker=self.name, exception=exc, will_retry=will_retry
            )
            self.progress()

    def _count_failure(self, job: Job, exc: BaseException, will_retry: bool) -> None:
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
                extra=log_fields("job_retry", self.name, job),
            )
        else:
            self.stats.failed += 1
            logger.error(
                "Job %s (%s) failed after %s attempt(s): %s",
                job.id,
                job.task,
                job.attempts,
                exc,
                extra=log_fields("job_failed", self.name, job),
            )

    def retry_later(self, job: Job, exc: RetryJob) -> None:
        with self.lock:
            done = self.retry(lambda: Job.objects.retry_later(self.name, job, exc.delay, str(exc)))
            self._release(job.id)
        if done:
            hooks.recorded(job, "retried")
            logger.info(
                "Job %s (%s) asked to run again in %.1f s: %s",
                job.id,
                job.task,
                exc.delay,
                exc,
                extra=log_fields("job_deferred", self.name, job),
            )

    def cancelled(self, job: Job, reason: str) -> None:
        with self.lock:
            self.retry(lambda: Job.objects.cancel_claimed(self.name, job, reason))
            self._release(job.id)
        hooks.recorded(job, "cancelled")
        logger.warning(
            "Job %s (%s): %s",
            job.id,
            job.task,
            reason,
            extra=log_fields("job_cancelled", self.name, job),
        )

    def due_in(self) -> float | None:
        """Seconds until the batched write of the done jobs is due (None: none waits)."""
        with self.lock:
            if not self._pending:
                return None
            return self._pending_since + self.flush_interval - time.monotonic()

    def flush(self, force: bool = False) -> None:
        """Write the done jobs waiting for it, when their batch is full or due (or now)."""
        with self.lock:
            pending = self._pending
            if not pending:
                return
            due = time.monotonic() - self._pending_since >= self.flush_interval
            if not (force or due or len(pending) >= self._flush_size):
                return
            started, ran = self._pending_started, self._pending_ran
            self._pending, self._pending_started, self._pending_ran = [], [], []
            finished = self.retry(lambda: Job.objects.finish_done(self.name, pending))
            self.slot.clear_log()
            self._release(*(job.id for job in pending))
            done = (
                pending
                if len(finished) == len(pending)
                else [job for job in pending if job.id in finished]
            )
            self.stats.done += len(done)
            hooks.ended(pending, started, ran, done)
            for job in done:
                signals.job_finished.send(Job, job=job, worker=self.name, result=job.result)
            for job in pending:
                if job.id not in finished:
                    logger.warning(
                        "Job %s finished, but another worker took it over meanwhile "
                        "(lease expired); not recorded twice",
                        job.id,
                        extra=log_fields("lease_lost", self.name, job),
                    )
            self.progress()

    def give_back(self, jobs: Sequence[Job], queues: Sequence[str]) -> None:
        """Hand claimed jobs that never started back to the queue, uncharged."""
        if not jobs:
            return
        ids = [job.id for job in jobs]
        with self.lock:
            given = self.retry(lambda: Job.objects.give_back(self.name, ids))
            self._release(*ids)
            self.handed_back += len(ids)
        announce.notify(queues)
        logger.info(
            "Worker %s: gave back %s unstarted job(s)",
            self.name,
            given,
            extra=log_fields("jobs_given_back", self.name),
        )

    # -- helpers -----------------------------------------------------------------------

    def retry(self, write: Callable[[], T]) -> T:
        """Run a recording write until the database takes it (see retry_transient)."""
        return retry_transient(
            write,
            logger,
            f"Worker {self.name} while recording",
            lambda: self.give_up_at,
            where="record",
        )

    def progress(self) -> None:
        stats = self.stats
        self.slot.count(stats.done, stats.failed, stats.retried)
        if self.on_progress is not None:
            self.on_progress(stats)
