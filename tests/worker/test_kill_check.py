"""The supervisor kills a child only while it is still on the run it decided to kill."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

from django_dbqueue.worker.children import Child, still_on
from django_dbqueue.worker.slots import SlotTable
from tests.support import wait_until


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def run_jobs_in_turn(table: Any, go: Any) -> None:
    """Run job 1 until told, then job 2 for ever."""
    slot = table[0]
    slot.start(1, None)
    go.wait()
    slot.end()
    slot.start(2, None)
    while True:
        time.sleep(0.01)


def start_child() -> tuple[Child, Any]:
    ctx = multiprocessing.get_context("fork")
    table = SlotTable(1, 4)
    go = ctx.Event()
    process = ctx.Process(target=run_jobs_in_turn, args=(table, go), daemon=True)
    process.start()
    child = Child(0, process, "test:1:kill", table[0], time.monotonic())
    wait_until(lambda: child.slot.running() is not None, timeout=10)
    return child, go


def test_a_child_still_on_the_run_is_left_stopped_for_the_kill() -> None:
    child, _ = start_child()
    pid = child.process.pid or 0
    try:
        running = child.slot.running()
        assert running is not None and running.job_id == 1
        assert still_on(child, running)
        assert state(pid) in "tT", "frozen until the SIGKILL"
    finally:
        os.kill(pid, signal.SIGKILL)
        child.process.join(10)
    assert child.process.exitcode == -signal.SIGKILL


def test_a_child_that_moved_on_is_thawed_and_spared() -> None:
    child, go = start_child()
    pid = child.process.pid or 0
    try:
        decided_on = child.slot.running()
        assert decided_on is not None and decided_on.job_id == 1
        go.set()  # job 1 ends between the supervisor's read and its kill
        wait_until(lambda: (child.slot.running() or decided_on).job_id == 2, timeout=10)
        assert not still_on(child, decided_on)
        wait_until(lambda: state(pid) not in "tT", timeout=5)
        assert child.process.is_alive()
    finally:
        os.kill(pid, signal.SIGKILL)
        child.process.join(10)
