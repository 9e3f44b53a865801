"""``run_jobs``: a supervisor and N child processes that run the jobs.

The supervisor runs no job code, so nothing a job does can hold it up. Each child writes
what it is doing to its slot in shared memory (:mod:`.slots`); the supervisor's loop
wakes as soon as a child exits, and every ``TICK`` otherwise, and:

- settles a dead child's jobs at once (:mod:`.deaths`) and starts a new child;
- kills (SIGKILL) a child whose job ran ``KILL_GRACE`` past its timeout without stopping
  on SIGALRM, whose cancelled job ignored its interrupt for ``KILL_GRACE``, or, after a
  second stop signal, that is still running ``KILL_GRACE`` later;
- every ``HEARTBEAT_INTERVAL`` renews the leases of all its children's jobs, refreshes the
  process rows and relays cancellations (:class:`.liveness.Keeper`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from django.db import connections

from django_dbqueue.conf import settings
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.worker import deaths, rows
from django_dbqueue.worker.children import Child, child_main, kill, overrun
from django_dbqueue.worker.connections import (
    TRANSIENT_ERRORS,
    DatabaseWaits,
    refresh_connections,
    retry_transient,
)
from django_dbqueue.worker.duties import BurstTicks, Duties
from django_dbqueue.worker.executors.base import held_capacity
from django_dbqueue.worker.handout import HostClaims, hands_out
from django_dbqueue.worker.liveness import Keeper, recover
from django_dbqueue.worker.loop import STOP_SIGNALS
from django_dbqueue.worker.progress import Progress, stop_line
from django_dbqueue.worker.recording import Stats
from django_dbqueue.worker.relay import Relay
from django_dbqueue.worker.slots import SlotTable

logger = logging.getLogger("django_dbqueue.supervisor")

TICK = 0.2


class Supervisor:
    def __init__(
        self,
        concurrency: int,
        worker_options: dict[str, Any],
        progress: Progress | None = None,
        stopped_early: Callable[[], int] | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.options = dict(worker_options)
        self.progress = progress
        self.stopped_early = stopped_early  # stop signals before run() had its handlers
        self.queues = list(worker_options.get("queues") or settings.QUEUES)
        self.duties = Duties(self.queues, progress.note if progress is not None else None)
        self.burst_ticks = BurstTicks(self.duties, self.queues)
        self.name = rows.process_name()
        batch_size = int(worker_options.get("batch_size") or settings.BATCH_SIZE)
        lanes = int(worker_options.get("threads") or 1)  # and one per async job at once
        lanes += int(worker_options.get("async_concurrency") or 0)
        self.table = SlotTable(concurrency, held_capacity(batch_size, lanes), lanes=lanes)
        # The host's one claimer (handout.py), for a supervisor of many children.
        self.claims = HostClaims(batch_size) if hands_out(concurrency) else None
        self.keeper = Keeper()
        self.relay = Relay(self.queues, concurrency)  # the host's wake-up listener: relay.py
        self._ctx = multiprocessing.get_context("fork")
        self._children: dict[int, Child] = {}
        self._graves: list[deaths.Remains] = []  # dead children not settled yet
        self._respawn_at: dict[int, float] = {}
        self._quick_deaths = [0] * concurrency
        self._retired = Stats()  # outcomes of children gone, so totals never go back
        self._processed = [0] * concurrency  # per slot, by children gone (--max-jobs shares)
        self._signals = 0
        self._stop_signal, self._told = int(signal.SIGTERM), True
        self._kill_all_at: float | None = None
        self._next_beat = 0.0
        self._grace = float(settings.KILL_GRACE)
        self._give_up_at: float | None = None  # stopping with the database away
        self._db_waits = DatabaseWaits("Supervisor", logger, self.name, where="supervisor")
        self._db_retry_at = 0.0  # monotonic time of the next try while the database is away

    # -- children ----------------------------------------------------------------------

    def _options_for(self, index: int) -> dict[str, Any]:
        options = {**self.options, "wakeup": self.relay.ear(index)}
        max_jobs = options.get("max_jobs")
        if max_jobs is not None:
            share = max_jobs // self.concurrency + (1 if index < max_jobs % self.concurrency else 0)
            options["max_jobs"] = max(0, share - self._processed[index])
        return options

    def _spawn(self, index: int) -> None:
        options = self._options_for(index)
        if options.get("max_jobs") == 0:
            return
        slot = self.table[index]
        slot.reset()
        token = rows.new_token()
        if self.claims is not None:
            options["handout"] = self.claims.open(index)
        # No connection of this thread's goes to a child. (The claimer's, in its own
        # thread, does: the child never uses it, and neither mysqlclient nor psycopg
        # closes a connection at a forked child's exit; on SQLite there is no claimer.)
        connections.close_all()
        process = self._ctx.Process(
            target=child_main,
            args=(self.table, index, token, options, os.getpid()),
            name=f"dbqueue-worker-{index}",
            daemon=False,
        )
        # The child starts with its stop signals blocked, until its worker has its
        # handlers (loop.py): a stop sent meanwhile then ends it cleanly, not with -15.
        # Ours stay blocked only across the fork; one that came meanwhile reaches the
        # child through _pass_on_stop.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        name = rows.process_name(process.pid, token)
        if self.claims is not None:
            options["handout"].close()  # the child's end: it has its own now
            self.claims.started(index, name)
        self._children[index] = Child(index, process, name, slot, time.monotonic())

    def _register_children(self) -> None:
        for child in self._children.values():
            if not child.registered:
                rows.register(
                    child.name,
                    child.process.pid or 0,
                    WorkerRow.Role.CHILD,
                    self.queues,
                    supervisor=self.name,
                )
                child.registered = True

    def _reap(self) -> None:
        now = time.monotonic()
        for index, child in list(self._children.items()):
            if child.process.is_alive():
                continue
            child.process.join()
            del self._children[index]
            if self.claims is not None:
                self.claims.gone(index)  # before its jobs are settled: see handout.py
            code = child.process.exitcode
            remains = deaths.Remains.read(child.name, code, child.slot)
            remains.kill = child.kill
            done, failed, retried = child.slot.totals()
            self._retired.done += done
            self._retired.failed += failed
            self._retired.retried += retried
            # What it leaves behind counts towards its slot's --max-jobs share now, so a
            # replacement started before the settling gets the right share.
            logged = {entry.job_id for entry in remains.done}
            crashed = sum(1 for run in remains.runs if run.job_id not in logged)
            self._processed[index] += done + failed + retried + len(logged) + crashed
            self.keeper.forget(child.name)
            self._graves.append(remains)
            # Exit code 0: the child ran out of work (--burst, --max-jobs) or was told to
            # stop. Anything else is a death, and its slot gets a new child.
            if code == 0 or self._signals:
                continue
            logger.warning(
                "Supervisor: worker %s (pid %s) %s%s; starting a replacement",
                child.name,
                child.process.pid,
                deaths.describe_exit(code),
                f" while running job(s) {', '.join(str(run.job_id) for run in remains.runs)}"
                if remains.runs
                else "",
                extra={"event": "worker_died", "worker": child.name},
            )
            # A child that dies before running anything is broken, not its jobs: wait a
            # little longer each time, rather than fork in a tight loop.
            quick = not remains.runs and now - child.started < 1.0
            self._quick_deaths[index] = self._quick_deaths[index] + 1 if quick else 0
            delay = min(5.0, 0.1 * 2 ** self._quick_deaths[index]) if quick else 0.0
            self._respawn_at[index] = now + delay

    def _burst_duties(self) -> None:
        respawning = bool(self._respawn_at)  # wait for those first
        idle = [] if respawning else [i for i in range(self.concurrency) if i not in self._children]
        for index in self.burst_ticks.turn(bool(self._children), idle, bool(self._signals)):
            self._respawn_at[index] = time.monotonic()

    def _settle_graves(self) -> None:
        for remains in list(self._graves):
            outcome = deaths.settle(remains)
            self._graves.remove(remains)
            self._retired.done += outcome.done
            self._retired.failed += outcome.failed
            self._retired.retried += outcome.retried
            if outcome.given_back:
                logger.info(
                    "Supervisor: gave back %s unstarted job(s) of worker %s",
                    outcome.given_back,
                    remains.name,
                    extra={"event": "jobs_given_back", "worker": remains.name},
                )

    def _respawn_due(self) -> None:
        now = time.monotonic()
        for index, when in list(self._respawn_at.items()):
            if self._signals:
                del self._respawn_at[index]
            elif now >= when:
                del self._respawn_at[index]
                self._spawn(index)

    # -- stopping jobs that do not stop ------------------------------------------------

    def _police(self) -> None:
        now = time.monotonic()
        stop_all = self._kill_all_at is not None and now >= self._kill_all_at
        for child in self._children.values():
            verdict = overrun(child, now, self._grace, self.keeper.interrupted, stop_all)
            if verdict is not None:
                kill(child, *verdict, self._grace, signal.Signals(self._stop_signal).name)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self._stop_signal = signum
        self._told = False  # said in the next turn: a handler must not write to stdout
        if self._signals > 1 and self._kill_all_at is None:
            self._kill_all_at = time.monotonic() + self._grace
        self._next_beat = 0.0  # show "stopping" in the rows at once
        for child in self._children.values():
            if child.stops_sent < self._signals:
                child.stops_sent = self._signals
                child.slot.pass_stop(signum)
                child._signal(signal.SIGTERM)

    def _tell_stop(self) -> None:
        """One line for each stop signal: what is finished and what is handed back."""
        if self._told or not self._signals:
            return
        self._told, slots = True, [child.slot for child in self._children.values()]
        line = stop_line(signal.Signals(self._stop_signal).name, self._signals, slots)
        if self.progress is not None:
            self.progress.note(line)
        logger.info("Supervisor: %s", line, extra={"event": "stopping", "worker": self.name})

    def _pass_on_stop(self) -> None:
        """Tell a child that missed it (started as the handler ran) that we are stopping.
        (The count is set before sending, so the handler, if it runs in between, skips it.)"""
        if self._signals:
            for child in self._children.values():
                if not child.stops_sent:
                    child.stops_sent = 1
                    child.slot.pass_stop(self._stop_signal)
                    child._signal(signal.SIGTERM)

    # -- the loop ----------------------------------------------------------------------

    def totals(self) -> Stats:
        stats = Stats(self._retired.done, self._retired.failed, self._retired.retried)
        for child in self._children.values():
            done, failed, retried = child.slot.totals()
            stats.done += done
            stats.failed += failed
            stats.retried += retried
        return stats

    def _stopping_give_up(self) -> float | None:
        return 0.0 if self._signals else None

    def _beat(self) -> None:
        now = time.monotonic()
        members = list(self._children.values())
        if now >= self._next_beat:
            totals = self.totals()
            stopping = bool(self._signals)
            own = rows.Beat(self.name, totals.done, totals.failed, stopping=stopping)
            self.keeper.beat(members, own, stopping=stopping)
            self._next_beat = now + float(settings.HEARTBEAT_INTERVAL)
        self.keeper.show_slow_jobs(members)

    def run(self) -> Stats:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        early = self.stopped_early() if self.stopped_early is not None else 0
        if early:
            self._signals += early  # stopped while starting: start no child
            logger.info("Supervisor: stopped while starting; starting no worker")
        try:
            self._start()
            while self._children or self._graves or self._respawn_at:
                sentinels = [child.process.sentinel for child in self._children.values()]
                if sentinels:
                    wait(sentinels, timeout=TICK)  # wakes as soon as a child exits
                else:
                    time.sleep(TICK)
                if not self._turn():
                    break
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            try:
                retry_transient(
                    lambda: rows.remove(self.name), logger, "Supervisor stopping", lambda: 0.0
                )
            except TRANSIENT_ERRORS:
                pass  # the row expires; nothing depends on a supervisor's row
            connections.close_all()
            self.relay.stop()
            if self.claims is not None:
                self.claims.stop()
        return self.totals()

    def _start(self) -> None:
        # Jobs of dead workers first: a cron --burst run may be the only one to recover them.
        role = WorkerRow.Role.SUPERVISOR
        retry_transient(
            lambda: rows.register(self.name, os.getpid(), role, self.queues),
            logger,
            "Supervisor starting",
            self._stopping_give_up,
        )
        retry_transient(recover, logger, "Supervisor recovering", self._stopping_give_up)
        self._next_beat = time.monotonic() + float(settings.HEARTBEAT_INTERVAL)
        # The ticks due now, before a --burst run's children look for work.
        give_up = self._stopping_give_up
        self.burst_ticks.pending.update(
            retry_transient(self.duties.run, logger, "Starting", give_up)
        )
        self.relay.start()  # listening before the children's first claims
        if self.claims is not None:
            self.claims.start()
        for index in range(self.concurrency):
            if self._signals:
                break  # told to stop while starting: start no children
            self._spawn(index)

    def _turn(self) -> bool:
        """One turn of the loop; False once it is time to give up: stopping, with no
        child left and the database away (the rest is left to lease recovery)."""
        self._pass_on_stop()
        self._tell_stop()
        self._reap()
        self._police()
        self._respawn_due()
        if self.claims is not None:
            self.claims.keep_running()
        try:
            if time.monotonic() >= self._db_retry_at:
                self._settle_graves()
                self._register_children()
                self._beat()
                if not self.options.get("burst"):
                    self.duties.run()
                else:
                    self._burst_duties()
                self._db_waits.succeeded()
        except TRANSIENT_ERRORS as exc:
            # Not every turn while it lasts (a turn is TICK): after the pause it says.
            self._db_retry_at = time.monotonic() + self._db_waits.failed(exc)
            refresh_connections()
            if not self._children and self._signals:
                now = time.monotonic()
                self._give_up_at = self._give_up_at or now + max(
                    30.0, float(settings.LEASE_TIMEOUT)
                )
                if now > self._give_up_at:
                    return False
        if self.progress is not None:
            self.progress.update(self.totals())
        return True
