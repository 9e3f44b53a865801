"""Testing code that enqueues: run the due jobs in-process, the way a worker runs them.

:func:`run_due_jobs` claims the due jobs with the worker's own claim, runs each through
the worker's one job run (:meth:`~django_dbqueue.worker.executors.base.Executor.run`:
the registry, the arguments as they came back from the database's JSON, the time limit,
retries and failures recorded by the worker's :class:`~django_dbqueue.worker.recording.Recorder`)
and returns what became of each job. There is no "eager" mode that calls functions
directly: a job whose arguments do not survive the JSON round trip fails here as it would
in production.

It runs in the caller's thread and on the caller's connection, so inside a ``TestCase``
(or pytest-django's ``db`` fixture) it sees the jobs the test enqueued in its
transaction, and none that were rolled back. A worker runs jobs outside any transaction,
so a job's ``transaction.on_commit()`` callbacks run as soon as it returns; inside a
test's transaction they would never run, so they are run when the job returns (those
of a rolled-back ``atomic()`` block are dropped, as Django drops them). See
docs/testing.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.db import connections

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import DBQueueError
from django_dbqueue.models import Job
from django_dbqueue.queue import clock
from django_dbqueue.queue.pausing import paused_queues
from django_dbqueue.registry import task_path
from django_dbqueue.worker.executors.base import Outcome
from django_dbqueue.worker.executors.inline import InlineExecutor
from django_dbqueue.worker.recording import Recorder
from django_dbqueue.worker.rows import process_name
from django_dbqueue.worker.slots import SlotTable

logger = logging.getLogger("django.db.backends.base")

__all__ = ["JobOutcome", "JobsTestMixin", "TooManyJobs", "run_due_jobs"]

# What a job came to, from its row after the run.
DONE, FAILED, RETRY, CANCELLED = "done", "failed", "retry", "cancelled"
_OUTCOME_OF_STATUS: dict[str, str] = {
    Job.Status.DONE: DONE,
    Job.Status.FAILED: FAILED,
    Job.Status.QUEUED: RETRY,  # a failed attempt with attempts left, or RetryJob
    Job.Status.CANCELLED: CANCELLED,
}
_BATCH = 100  # jobs claimed at a time


class TooManyJobs(DBQueueError, AssertionError):
    """:func:`run_due_jobs` ran ``max_jobs`` jobs and due jobs were still left (a job
    that enqueues itself, or a retry without delay)."""


@dataclass(frozen=True)
class JobOutcome:
    """What one run of a job came to.

    ``status`` is ``"done"``, ``"failed"`` (no attempt left), ``"retry"`` (the attempt
    failed or raised ``RetryJob``; the job waits for its next attempt) or
    ``"cancelled"``. ``result`` is the stored result (after the JSON round trip),
    ``error`` the exception the job raised (None when it returned).
    """

    job_id: int
    task: str
    status: str
    result: Any
    error: BaseException | None
    attempts: int
    job: Job

    @property
    def ok(self) -> bool:
        return self.status == DONE


def run_due_jobs(
    queues: Sequence[str] | None = None,
    tasks: Iterable[Any] | None = None,
    follow: bool = True,
    max_jobs: int = 1000,
) -> list[JobOutcome]:
    """Run the jobs that are due now, in this thread, as a worker would; return what
    became of each, in the order they ran.

    ``queues``: only these queues (default: every queue of ``DBQUEUE['QUEUES']``; paused
    queues are skipped, as workers skip them). ``tasks``: only jobs of these tasks
    (functions, ``@task`` objects or dotted paths); other due jobs stay queued as they
    were. ``follow``: also run the jobs that become due while it runs (those the jobs
    enqueue, a retry without delay) until none is left; with ``follow=False`` only the
    jobs due when it was called run, each once. ``max_jobs``: raise
    :class:`TooManyJobs` rather than run more than this many.
    """
    wanted_tasks = None if tasks is None else {task_path(task) for task in tasks}
    paused = paused_queues()
    runner = _Runner([q for q in (queues or settings.QUEUES) if q not in paused])
    first = None if follow else set(runner.due_ids())

    def wanted(job: Job) -> bool:
        if wanted_tasks is not None and job.task not in wanted_tasks:
            return False
        return first is None or (job.id in first and job.id not in runner.ran_ids)

    signals.job_failed.connect(runner.failed, weak=False)
    try:
        while runner.step(wanted):
            if len(runner.outcomes) > max_jobs:
                raise TooManyJobs(
                    f"run_due_jobs() ran more than max_jobs={max_jobs} jobs and due jobs "
                    "are left: does a job enqueue itself, or retry without a delay?"
                )
    finally:
        signals.job_failed.disconnect(runner.failed)
        runner.give_back()
    return runner.outcomes


class _Runner:
    """The worker's claim, its one job run and its recorder, in the calling thread."""

    def __init__(self, queues: list[str]) -> None:
        self.queues = queues
        self.name = process_name(token="run_due_jobs")
        self.recorder = Recorder(self.name, SlotTable(1, _BATCH)[0])
        self.executor = _AsIfAutocommit(self.recorder, threading.Event(), False)
        self.held: list[Job] = []  # claimed but not wanted: given back at the end
        self.ran_ids: set[int] = set()
        self.outcomes: list[JobOutcome] = []
        self.errors: dict[int, BaseException] = {}

    def due_ids(self) -> list[int]:
        """Due by the queue's clock, as enqueue and the claim judge it (queue/clock.py):
        not the database's ``NOW()``, which on PostgreSQL is when the test's transaction
        began, and is behind the clock enqueue read by up to that reading's round trip."""
        now = clock.queue_now()
        return list(
            Job.objects.filter(
                status=Job.Status.QUEUED, queue__in=self.queues, run_after__lte=now
            ).values_list("id", flat=True)
        )

    def failed(
        self, sender: Any, job: Job, worker: str, exception: BaseException, **_: Any
    ) -> None:
        if worker == self.name:
            self.errors[job.id] = exception

    def step(self, wanted: Callable[[Job], bool]) -> bool:
        """Claim once and run what is wanted; False when the claim found nothing."""
        jobs = Job.objects.claim(self.name, _BATCH, self.queues) if self.queues else []
        if not jobs:
            return False
        run = [job for job in jobs if wanted(job)]
        self.held += [job for job in jobs if not wanted(job)]
        self.recorder.hold(run)
        self.executor.submit(run)  # runs them one by one, then writes what finished
        self.ran_ids.update(job.id for job in run)
        # Read now: a job run again by a later claim (a retry without delay) is
        # reported once per run.
        rows = Job.objects.in_bulk([job.id for job in run])
        for job in run:
            row = rows.get(job.id, job)  # a job that deleted its own row: as it ran
            status = _OUTCOME_OF_STATUS.get(row.status, row.status)
            error = None if status == DONE else self.errors.pop(job.id, None)
            self.outcomes.append(
                JobOutcome(job.id, job.task, status, row.result, error, row.attempts, row)
            )
        return True

    def give_back(self) -> None:
        held, self.held = self.held, []
        if held:
            Job.objects.give_back(self.name, [job.id for job in held])


class _AsIfAutocommit(InlineExecutor):
    """The inline executor, with what running outside a transaction would have done for
    a job run inside the test's one.

    Each job runs in a savepoint of every connection in a transaction: a job whose
    database error breaks the transaction (an IntegrityError) has its writes rolled
    back to it, so the test's transaction (and the recording of the failure) goes on; a
    job that raises otherwise keeps its writes, as autocommitted writes are kept. Its
    ``on_commit()`` callbacks run when it returns; a callback's error fails the job, as
    it would raise from the job's own ``on_commit()`` call in a worker.
    """

    def call(self, job: Job, lane: int, timeout: float | None, began: float) -> Outcome:
        atomic = [conn for conn in connections.all(initialized_only=True) if conn.in_atomic_block]
        marks = {conn.alias: len(conn.run_on_commit) for conn in connections.all()}
        # The connections' own savepoint calls: transaction.savepoint() is deprecated on 6.1.
        savepoints = [(conn, conn.savepoint()) for conn in atomic]
        result, error = super().call(job, lane, timeout, began)
        for conn, sid in savepoints:
            if sid is None:  # savepoints not allowed (autocommit): nothing to end
                continue
            if conn.needs_rollback:
                conn.needs_rollback = False  # as Atomic.__exit__ does, to roll back
                conn.savepoint_rollback(sid)
            else:
                conn.savepoint_commit(sid)
        try:
            _run_new_callbacks(marks)
        except Exception as exc:  # the job's failure, as in a worker
            if error is None:
                return None, exc
        return result, error


def _run_new_callbacks(marks: dict[str, int]) -> None:
    """Run (and forget) the on_commit callbacks registered since ``marks``, and those they
    register, as ``TestCase.captureOnCommitCallbacks(execute=True)`` runs them."""
    for conn in connections.all():
        start = marks.get(conn.alias, 0)
        while len(conn.run_on_commit) > start:
            # (savepoint ids, func, robust): the stubs know the older 2-tuples.
            _sids, func, robust = cast(tuple[Any, Any, bool], conn.run_on_commit.pop(start))
            if not robust:
                func()
                continue
            try:
                func()
            except Exception:  # robust: logged and passed over, as Django does
                logger.exception("Error calling %s in on_commit() (%s)", func, conn.alias)


class JobsTestMixin:
    """For ``django.test.TestCase`` (and ``TransactionTestCase``) classes:
    ``self.run_due_jobs(...)`` is :func:`run_due_jobs`, and ``self.assertJobsDone(...)``
    fails with each failed job's error when not every outcome is done."""

    def run_due_jobs(
        self,
        queues: Sequence[str] | None = None,
        tasks: Iterable[Any] | None = None,
        follow: bool = True,
        max_jobs: int = 1000,
    ) -> list[JobOutcome]:
        return run_due_jobs(queues=queues, tasks=tasks, follow=follow, max_jobs=max_jobs)

    def assertJobsDone(self, outcomes: Sequence[JobOutcome]) -> None:
        failed = [o for o in outcomes if not o.ok]
        if failed:
            lines = [f"job {o.job_id} ({o.task}): {o.status}: {o.error!r}" for o in failed]
            raise AssertionError("not every job is done:\n" + "\n".join(lines))
