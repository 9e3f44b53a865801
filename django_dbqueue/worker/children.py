"""A supervisor's child process: how it starts in the fork, and how it is killed safely.

The child runs one :class:`~django_dbqueue.worker.loop.Worker` on its slot. It dies with
its supervisor (a child must not outlive the process that keeps its leases), ignores
SIGINT (a Ctrl-C reaches the whole process group; the supervisor passes the stop on), and
starts with its stop signals blocked until the worker's handlers are in place, so that a
stop sent while it starts ends it cleanly. :func:`still_on` makes sure a kill meant for
one job does not take down the next one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from django.db import connections

from django_dbqueue.worker import deaths, rows
from django_dbqueue.worker.loop import make_worker
from django_dbqueue.worker.slots import RUNNING, Running, Slot, SlotTable

logger = logging.getLogger("django_dbqueue.supervisor")

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when the supervisor dies (Linux).

    A child must not outlive the process that keeps its leases: its job would be
    recovered and run a second time while it still runs. Elsewhere the child notices
    between jobs that its parent is gone.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(1)


def child_main(
    table: SlotTable, index: int, token: str, options: dict[str, Any], parent: int
) -> None:
    _die_with_parent(parent)
    # The supervisor forwards SIGTERM to us; it stays blocked, as it was at the fork,
    # until the worker has its handler. A Ctrl-C reaches the whole process group, so
    # children ignore SIGINT: otherwise one Ctrl-C would arrive twice (directly and
    # forwarded) and count as the second, "stop now" signal.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name = rows.process_name(os.getpid(), token)
    worker = make_worker(
        slot=table[index], name=name, ignore_sigint=True, parent_pid=parent, **options
    )
    worker.run()
    connections.close_all()
    sys.exit(0)


def overrun(
    child: Child,
    now: float,
    grace: float,
    interrupted: dict[tuple[str, int], tuple[int, float, float]],
    stop_all: bool,
) -> tuple[str, Running | None] | None:
    """Why the supervisor must kill ``child`` now, and for which run, or None: a second
    stop signal ``grace`` ago (``stop_all``), a job ``grace`` past its timeout, or a
    cancelled job (``interrupted``: the keeper's) ``grace`` after its interrupt."""
    if child.kill is not None:
        return None
    runs = child.slot.runs()
    if stop_all:
        return deaths.STOP, runs[0] if runs else None
    for running in runs:
        if running.phase != RUNNING:
            continue
        if running.deadline and now > running.deadline + grace:
            return deaths.TIMEOUT, running
        sent = interrupted.get((child.name, running.lane))
        if sent is not None and sent[:2] == (running.job_id, running.started):
            if now > sent[2] + grace:
                return deaths.CANCEL, running
    return None


def kill(child: Child, reason: str, running: Running | None, grace: float, stop: str) -> None:
    """SIGKILL ``child`` for ``reason`` (its job ``running``), unless that job ended just
    now; ``stop``: the stop signal run_jobs got."""
    if reason != deaths.STOP and running is not None and not still_on(child, running):
        return  # the job ended just now: the next one must not go down with it
    job_id = running.job_id if running is not None else 0
    timeout = running.deadline - running.started if running is not None else 0.0
    child.kill = deaths.Kill(reason, job_id, grace, timeout, stop)
    # (A threaded child's other running jobs go down with it: deaths.py gives them
    # back uncharged, since they did nothing wrong.)
    logger.warning(
        "Supervisor: killing worker %s (job %s: %s)",
        child.name,
        job_id or "none",
        reason,
        extra={"event": "worker_killed", "worker": child.name, "job_id": job_id},
    )
    child._signal(signal.SIGKILL)


def still_on(child: Child, running: Running) -> bool:
    """Freeze the child (SIGSTOP) and check it is still on this run; thaw it if not.

    Between reading a slot and killing its process the job may end and the next one
    start. A stopped process writes nothing, so its slot can be read for certain. Where
    /proc does not say a process has stopped, the check is skipped.
    """
    pid = child.process.pid or 0
    stat = f"/proc/{pid}/stat"
    if not os.path.exists(stat):
        return True
    child._signal(signal.SIGSTOP)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        try:
            with open(stat) as status:
                state = status.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return True  # gone already
        if state in "tTZX":
            break
        time.sleep(0.001)
    now = child.slot.running(lane=running.lane)
    same = (
        now is not None
        and now.phase == RUNNING
        and (now.job_id, now.started) == (running.job_id, running.started)
    )
    if not same:
        child._signal(signal.SIGCONT)
    return same


@dataclass(eq=False)
class Child:
    index: int
    process: BaseProcess
    name: str
    slot: Slot
    started: float
    registered: bool = False
    kill: deaths.Kill | None = None
    stops_sent: int = 0  # stop signals passed on to it

    def interrupt(self) -> None:
        self._signal(signal.SIGUSR1)

    def _signal(self, signum: int) -> None:
        try:
            os.kill(self.process.pid or 0, signum)
        except ProcessLookupError:
            pass  # already gone; the loop reaps it
