"""A child process died: settle, at once, every job it held.

What its slot says decides each job's fate:

- finished jobs still waiting for their batched write (the slot's done log) are recorded
  DONE with their results, so none of them runs again;
- the job it was running gets its attempt counted and an error naming what happened (the
  signal or exit code, or the supervisor's reason for killing it); a job that kills its
  worker every time ends FAILED after ``max_attempts``;
- every other job it had claimed goes back to the queue at once, attempt not counted.

A threaded child (``run_jobs --threads T``) runs up to T jobs at once, and one death
ends them all:

- killed by the supervisor for one job (its timeout, its cancellation): that job is
  charged as above; the others it was running go back uncharged, "killed with a
  sibling" (they run again from the start);
- a second stop signal: every running job is charged (WorkerShutdown), as each ignored it;
- any other death (segfault, ``os._exit``, OOM, ``kill -9``) while it ran two jobs or
  more: which thread caused it cannot be told, so none is charged. Each goes back to the
  queue at once, the death noted in its errors, and is *suspect* from then on (see
  :func:`suspect`): a worker runs a suspect job alone, with no other job in its process,
  so a crash then is that job's own and is charged like any crash of a one-job process.
  An innocent job costs one uncharged rerun; a crashing one fails after ``max_attempts``
  crashes of its own.

Every write is guarded by (status = claimed, owner = the dead child), so settling twice,
or after lease recovery got there first, changes nothing.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.observability import hooks
from django_dbqueue.queue import announce
from django_dbqueue.worker import rows
from django_dbqueue.worker.liveness import wall_time
from django_dbqueue.worker.slots import RUNNING, Done, Running, Slot

logger = logging.getLogger("django_dbqueue.supervisor")

# Why the supervisor itself killed a child (Kill.reason).
TIMEOUT, CANCEL, STOP = "timeout", "cancel", "stop"


class WorkerDied(Exception):
    """The error recorded for a job whose worker process died while running it."""


WORKER_DIED = f"{WorkerDied.__module__}.{WorkerDied.__qualname__}"


def suspect(job: Job) -> bool:
    """Did a process die while running this job? Then it runs alone in its process (a
    threaded worker starts nothing beside it), so that a crash is charged to its cause."""
    errors = job.errors
    return bool(errors) and any(
        isinstance(entry, dict) and entry.get("exception_class_path") == WORKER_DIED
        for entry in errors
    )


@dataclass
class Kill:
    reason: str
    job_id: int
    grace: float
    timeout: float = 0.0
    signal: str = "SIGTERM"  # the stop signal run_jobs got (reason STOP)


@dataclass
class Outcome:
    done: int = 0
    failed: int = 0
    retried: int = 0
    given_back: int = 0


@dataclass
class Remains:
    """What a dead child's slot said, read before the slot is handed to a new child."""

    name: str
    exitcode: int | None
    runs: list[Running]
    held: list[int]
    done: list[Done]
    kill: Kill | None = None
    # Steps already taken, so a retry after a database error does not repeat them.
    outcome: Outcome = field(default_factory=Outcome)
    steps: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, name: str, exitcode: int | None, slot: Slot) -> Remains:
        return cls(name, exitcode, slot.runs(writer_gone=True), slot.held(), slot.done_log())

    @property
    def running(self) -> Running | None:
        """The job it was running (the first lane's, for a threaded child)."""
        return self.runs[0] if self.runs else None


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-exitcode} ({name})"
    return f"exited with code {exitcode}"


def _error(remains: Remains, running: Running, others: list[int]) -> tuple[str, str, bool]:
    """(error text, error class path, counts as an attempt) for a job it was running;
    ``others``: the ids of the jobs its other threads were running."""
    kill, name = remains.kill, remains.name
    if kill is not None and (kill.reason == STOP or kill.job_id == running.job_id):
        after = f"did not stop within {kill.grace:g} s"
        killed = f"so the supervisor killed its worker process {name} (SIGKILL)"
        if kill.reason == TIMEOUT:
            return (
                f"JobTimeout: the job ran past its timeout of {kill.timeout:g} s and {after} "
                f"after it (it ignored SIGALRM, e.g. stuck in C code), {killed}.",
                "django_dbqueue.exceptions.JobTimeout",
                True,
            )
        if kill.reason == CANCEL:
            return (
                f"Job {running.job_id} was cancelled by an operator while running; it "
                f"{after} of being asked to stop, {killed}.",
                "django_dbqueue.exceptions.JobCancelled",
                True,
            )
        return (
            f"WorkerShutdown: run_jobs was stopped by a second signal ({kill.signal}) and "
            f"the job {after}, "
            f"{killed}.",
            "django_dbqueue.exceptions.WorkerShutdown",
            True,
        )
    if kill is not None:
        # Killed for another job: a sibling in another thread, or one that ended just
        # before the SIGKILL landed (where the supervisor could not freeze the process to
        # make sure). Not this job's doing, so it goes back to the queue uncharged.
        return "", "", False
    doing = "running this job" if running.phase == RUNNING else "recording this job's outcome"
    if others:
        ids = ", ".join(str(job_id) for job_id in others)
        return (
            f"{WorkerDied.__name__}: worker process {name} {describe_exit(remains.exitcode)} "
            f"while {doing} and, in its other threads, job(s) {ids}. Which one caused it "
            "cannot be told, so none is charged: each runs again alone (nothing else in "
            "its process), where a crash is its own.",
            WORKER_DIED,
            False,
        )
    return (
        f"{WorkerDied.__name__}: worker process {name} {describe_exit(remains.exitcode)} "
        f"while {doing}.",
        WORKER_DIED,
        True,
    )


def _record_done(remains: Remains) -> set[int]:
    # Whether the attempt was the first is not in the log: both starts are given, and
    # finish_done writes started_at only where it is still NULL.
    jobs = [
        Job(
            id=entry.job_id,
            started_at=wall_time(entry.started_wall),
            last_attempted_at=wall_time(entry.started_wall),
            finished_at=wall_time(entry.finished_wall),
            result=entry.result,
        )
        for entry in remains.done
    ]
    finished = Job.objects.finish_done(remains.name, jobs)
    if finished:
        done = list(Job.objects.primary().filter(pk__in=finished))
        logged = {entry.job_id: entry for entry in remains.done}
        entries = [logged[job.id] for job in done]
        started = [wall_time(entry.started_wall) for entry in entries]
        ran = [entry.finished_wall - entry.started_wall for entry in entries]
        hooks.ended(done, started, ran, done)
        for job in done:
            signals.job_finished.send(Job, job=job, worker=remains.name, result=job.result)
    remains.outcome.done += len(finished)
    return finished


def _record_running(remains: Remains, running: Running, others: list[int]) -> bool:
    """Record the attempt of a job it was running; False if it goes back uncharged."""
    job = Job.objects.primary().filter(
        pk=running.job_id, status=Job.Status.CLAIMED, owner=remains.name
    )
    found = job.first()
    if found is None:
        return True  # already recorded (or taken over): nothing left to do
    text, error_class, counts = _error(remains, running, others)
    if not counts and remains.kill is None:
        # Suspect: back to the queue uncharged, marked to run alone (see suspect()).
        if Job.objects.give_back_suspect(remains.name, found, text, error_class):
            remains.outcome.given_back += 1
            logger.warning(
                "Job %s (%s): %s",
                found.id,
                found.task,
                text,
                extra={"event": "job_suspect", "job_id": found.id, "worker": remains.name},
            )
        return True
    if not counts:
        logger.warning(
            "Job %s (%s): its worker process %s was killed for job %s; this job goes back "
            "to the queue, attempt not counted (killed with a sibling).",
            found.id,
            found.task,
            remains.name,
            remains.kill.job_id if remains.kill is not None else "?",
            extra={"event": "job_given_back", "job_id": found.id, "worker": remains.name},
        )
        return False
    found.note_attempt(wall_time(running.started_wall))
    kill = remains.kill
    if kill is not None and kill.reason == CANCEL and kill.job_id == found.id:
        if Job.objects.cancel_claimed(remains.name, found, text):
            hooks.recorded(found, "cancelled")
        return True
    status = Job.objects.finish_failed_attempt(remains.name, found, text, error_class)
    if status is None:
        return True
    will_retry = status == Job.Status.QUEUED
    if will_retry:
        remains.outcome.retried += 1
    else:
        remains.outcome.failed += 1
    (logger.warning if will_retry else logger.error)(
        "Job %s (%s): %s Attempt %s of %s%s.",
        found.id,
        found.task,
        text,
        found.attempts,
        found.max_attempts,
        ", will retry" if will_retry else ", the job has FAILED",
        extra={"event": "job_killed", "job_id": found.id, "worker": remains.name},
    )
    signals.job_failed.send(
        Job, job=found, worker=remains.name, exception=WorkerDied(text), will_retry=will_retry
    )
    return True


def settle(remains: Remains) -> Outcome:
    """Settle a dead child's jobs; raises the database's transient errors (retry later)."""
    skip: set[int] = {entry.job_id for entry in remains.done}
    if "done" not in remains.steps:
        _record_done(remains)
        remains.steps.add("done")
    runs = [run for run in remains.runs if run.job_id not in skip]
    for running in runs:
        step = f"running-{running.job_id}"
        if step not in remains.steps:
            others = [run.job_id for run in runs if run is not running]
            charged = _record_running(remains, running, others)
            remains.steps.add(step if charged else f"{step}-uncharged")
        if step in remains.steps:
            skip.add(running.job_id)
    # Its claimed jobs, from the slot and from the table: a claim committed just before
    # the child died may not have reached the slot.
    claimed = set(
        Job.objects.primary()
        .filter(status=Job.Status.CLAIMED, owner=remains.name)
        .values_list("id", flat=True)
    )
    rest = sorted((set(remains.held) | claimed) - skip)
    if rest:
        given = Job.objects.give_back(remains.name, rest)
        remains.outcome.given_back += given
        if given:
            announce.notify(settings.QUEUES)
    rows.remove(remains.name)
    return remains.outcome
