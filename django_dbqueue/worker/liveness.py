"""Keeping live workers' jobs theirs, and taking back the jobs of workers that are gone.

Each heartbeat the keeper renews the lease of every job its workers hold (read from
their slots, so it costs the workers nothing), refreshes their rows, relays operators'
cancellations, and recovers jobs whose lease ran out. ``run_jobs`` runs the keeper in
the supervisor, a process no job's code runs in: a job that holds the GIL or blocks in C
code cannot stop its own lease from being renewed. A worker run unsupervised
(``Worker.run()`` called directly, as tests and embedders do) runs it in a heartbeat
thread instead, with the old limits: such a job stalls that thread too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from django.conf import settings as django_settings
from django.db import connections, router

from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue import announce, clock
from django_dbqueue.worker import rows
from django_dbqueue.worker.connections import (
    TRANSIENT_ERRORS,
    DatabaseWaits,
    refresh_connections,
)
from django_dbqueue.worker.slots import RUNNING, Slot

logger = logging.getLogger("django_dbqueue.worker")

# A running job is written to its worker's row once it has run this long. Lease recovery
# charges an attempt only for the job a dead worker's row names, so jobs that had not
# started are not charged; waiting a moment keeps fast jobs from costing a write each.
SHOW_AFTER = 0.5
# A host whose clock is further than this from the database's is told so once. The queue
# compares only the database's times (queue/clock.py), but logs, job code and whatever
# else reads this host's clock are off by that much.
CLOCK_SKEW_WARNING = 5.0


class Member(Protocol):
    """A worker process whose jobs a keeper looks after."""

    @property
    def name(self) -> str: ...

    @property
    def slot(self) -> Slot: ...

    def interrupt(self) -> None:
        """Ask the running jobs the slot marks cancelled to stop (SIGUSR1: the worker
        raises JobCancelled in each)."""


def wall_time(timestamp: float) -> datetime:
    if django_settings.USE_TZ:
        return datetime.fromtimestamp(timestamp, tz=UTC)
    return datetime.fromtimestamp(timestamp)  # naive, as USE_TZ = False wants


def recover() -> None:
    """Requeue (or fail) the claimed jobs whose lease ran out: their workers are gone."""
    requeued, failed = Job.objects.recover_expired()
    if requeued:
        announce.notify(settings.QUEUES)
    if requeued or failed:
        logger.warning(
            "Recovered %s job(s) of workers that stopped renewing their leases: %s "
            "requeued, %s failed (attempts spent)",
            requeued + failed,
            requeued,
            failed,
            extra={"event": "jobs_recovered"},
        )


class Keeper:
    def __init__(self) -> None:
        # (member name, lane) -> (the run interrupted: its job id and start, when sent)
        self.interrupted: dict[tuple[str, int], tuple[int, float, float]] = {}
        self._shown: dict[str, int | None] = {}  # member name -> job id its row shows
        self._skew_told = False
        self._noted: dict[str, set[int]] = {}  # member name -> running jobs given starts

    def forget(self, name: str) -> None:
        for key in [key for key in self.interrupted if key[0] == name]:
            del self.interrupted[key]
        self._shown.pop(name, None)
        self._noted.pop(name, None)

    def beat(
        self, members: Sequence[Member], own: rows.Beat | None = None, stopping: bool = False
    ) -> None:
        """One heartbeat; raises the database's transient errors for the caller to log."""
        refresh_connections()
        offset = self._clock_offset()
        beats = []
        for member in members:
            held = member.slot.held()
            Job.objects.renew_leases(member.name, held)
            self._relay_cancellations(member, held)
            beats.append(self._row_of(member))
            beats[-1].stopping = stopping
        if own is not None:
            beats.append(own)
        rows.beat(beats, offset)
        recover()
        rows.prune()

    def _clock_offset(self) -> float:
        """This host's clock against the database's (one read a heartbeat, which also
        keeps this process's reading of the database's clock fresh); said once if far."""
        offset = clock.offset(router.db_for_write(Job))
        if abs(offset) > CLOCK_SKEW_WARNING and not self._skew_told:
            self._skew_told = True
            logger.warning(
                "This host's clock is %.1f s %s the database's. The queue uses the "
                "database's clock; fix this host's time sync (NTP) for logs and job code.",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
                extra={"event": "clock_skew", "offset": offset},
            )
        return offset

    def show_slow_jobs(self, members: Sequence[Member]) -> None:
        """Keep each member's row naming the job it runs once that has run SHOW_AFTER s,
        and nothing once it has ended: a write when a slow job starts and one when it
        ends; fast jobs cost none. The job's own row gets its start times then too, so
        a running job reads as started (fast ones get them with their outcome).

        A threaded member runs several: each gets its start times, and its row names the
        one that started last. Jobs start in the order they were handed to the threads,
        so lease recovery, which takes the jobs after the named one in claim order as
        not started (queue/leases.py), can only take a running one for unstarted (and
        not charge it), never the other way round."""
        now = time.monotonic()
        for member in members:
            runs = [run for run in member.slot.runs() if now - run.started >= SHOW_AFTER]
            noted = self._noted.setdefault(member.name, set())
            for run in runs:
                if run.job_id not in noted:
                    started = wall_time(run.started_wall)
                    Job.objects.note_running(member.name, run.job_id, started)
            noted.intersection_update(run.job_id for run in runs)
            noted.update(run.job_id for run in runs)
            running = max(runs, key=lambda run: run.started, default=None)
            job_id = running.job_id if running is not None else None
            if self._shown.get(member.name) == job_id:
                continue
            if running is None:
                rows.show_running(member.name, None, None)
            else:
                rows.show_running(member.name, running.job_id, wall_time(running.started_wall))
            self._shown[member.name] = job_id

    def _row_of(self, member: Member) -> rows.Beat:
        done, failed, _ = member.slot.totals()
        return rows.Beat(member.name, done, failed)

    def _relay_cancellations(self, member: Member, held: list[int]) -> None:
        cancelled = Job.objects.cancel_requested_ids(member.name, held) if held else set()
        runs = member.slot.runs()
        targets = [run for run in runs if run.phase == RUNNING and run.job_id in cancelled]
        member.slot.request_cancel(sorted(cancelled), targets)
        wanted = {(member.name, run.lane): run for run in targets}
        for key in [key for key in self.interrupted if key[0] == member.name]:
            if key not in wanted:
                del self.interrupted[key]
        fresh = False
        for key, run in wanted.items():
            if self.interrupted.get(key, (0, 0.0, 0.0))[:2] != (run.job_id, run.started):
                self.interrupted[key] = (run.job_id, run.started, time.monotonic())
                fresh = True
        if fresh:
            member.interrupt()


class HeartbeatThread(threading.Thread):
    """The keeper of a worker that runs unsupervised, beating in a thread of its own."""

    def __init__(self, member: Member) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{member.name}")
        self.member = member
        # The next beat is due after the interval anyway: the pause is not used.
        self.waits = DatabaseWaits(
            f"Worker {member.name} heartbeat", logger, member.name, where="heartbeat"
        )
        self.stop = threading.Event()
        self.keeper = Keeper()

    def run(self) -> None:
        interval = float(settings.HEARTBEAT_INTERVAL)
        try:
            while not self.stop.wait(interval):
                try:
                    self.keeper.beat([self.member])
                    self.keeper.show_slow_jobs([self.member])
                except TRANSIENT_ERRORS as exc:
                    self.waits.failed(exc)
                    refresh_connections()
                else:
                    self.waits.succeeded()
        finally:
            connections.close_all()
