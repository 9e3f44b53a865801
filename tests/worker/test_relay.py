"""One LISTEN connection per host: a run_jobs supervisor listens for its children and
relays what it hears (worker/relay.py). Real run_jobs processes on PostgreSQL."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.queue import pausing
from tests.support import Processes, jobs, wait_until

pytestmark = [
    pytest.mark.only_vendor("postgresql"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
]

# Without a wake-up an idle worker would wait this long (and read the paused set as
# seldom): a job done well before it was woken.
POLL = 30
WOKEN_WITHIN = 10.0
CHILDREN = 4


def listen_sessions() -> list[tuple[int, int]]:
    """(backend pid, client port) of the sessions on the test database that LISTEN."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, client_port FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
            " AND pid <> pg_backend_pid()"
        )
        return [(int(pid), int(port)) for pid, port in cursor.fetchall()]


def local_ports(pid: int) -> set[int]:
    """The local ports of the TCP sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def start(processes: Processes, worker_env: Callable[..., dict[str, str]]) -> subprocess.Popen[str]:
    """run_jobs with CHILDREN children, all of them registered and past their first
    (empty) claim, idle in a POLL s wait unless woken."""
    env = worker_env(POLL_INTERVAL=POLL, MIN_POLL_INTERVAL=POLL)
    proc = processes.run_jobs("--concurrency", str(CHILDREN), env=env)
    children = WorkerRow.objects.filter(role=WorkerRow.Role.CHILD)
    wait_until(lambda: children.count() == CHILDREN and listen_sessions(), timeout=60)
    # Every child takes a job (the one that claims first takes one only: BATCH_SIZE is
    # shared out by demand), so every child has begun waiting by the end.
    picked_up(proc, [enqueue(jobs.noop) for _ in range(CHILDREN)])
    return proc


def picked_up(proc: subprocess.Popen[str], created: list[Job]) -> float:
    """Seconds until every job of ``created`` (enqueued just now) was done."""
    sent = time.monotonic()
    ids = [job.pk for job in created]
    done = Job.objects.filter(pk__in=ids, status=Job.Status.DONE)
    wait_until(lambda: done.count() == len(ids) or proc.poll() is not None, timeout=POLL + 30)
    assert proc.poll() is None, proc.communicate()
    return time.monotonic() - sent


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out


def test_a_supervisor_of_four_children_holds_the_one_listen_session_and_wakes_them(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    proc = start(processes, worker_env)
    delays = []
    for _ in range(5):
        time.sleep(0.5)  # idle again, in a POLL s wait unless woken
        delays.append(picked_up(proc, [enqueue(jobs.noop)]))
    assert max(delays) < WOKEN_WITHIN, delays
    # Every child has claimed (and, listening itself, would have opened its LISTEN).
    [(_, port)] = listen_sessions()
    assert port in local_ports(proc.pid), "the supervisor holds it, not a child"
    out = stop(proc)
    expected = "up to 7 (1 supervisor + 1 LISTEN (relayed to the children) + 1 claiming for"
    assert f"{expected} the children + 4 x 1" in out, out


def test_pause_and_resume_reach_idle_children_through_the_relay(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    proc = start(processes, worker_env)
    # Idle again: a child still in the claim after its warm-up job could read the paused
    # set before the pause and its candidates after the next enqueue (as without a relay).
    time.sleep(1.0)
    # The children read the paused set every POLL s, or at once when a switch is relayed.
    pausing.pause("default")
    # Its announcement wakes the children: had they not heard the pause, they run it now.
    waiting = enqueue(jobs.noop)
    time.sleep(1.0)
    resumed = timezone.now()
    pausing.resume("default")
    assert picked_up(proc, [waiting]) < WOKEN_WITHIN, "the resume woke them"
    started = Job.objects.get(pk=waiting.pk).started_at
    assert started is not None and started >= resumed, "it waited for the resume"
    stop(proc)


def test_a_killed_listen_session_is_opened_again_and_children_still_get_jobs(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    proc = start(processes, worker_env)
    [(killed, _)] = listen_sessions()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [killed])
    wait_until(lambda: [pid for pid, _ in listen_sessions()] not in ([], [killed]), timeout=60)
    [(_, port)] = listen_sessions()
    assert port in local_ports(proc.pid)
    delays = []
    for _ in range(3):
        time.sleep(0.5)
        delays.append(picked_up(proc, [enqueue(jobs.noop)]))
    assert max(delays) < WOKEN_WITHIN, delays
    out = stop(proc)
    assert out.count("wake-up listener failed") == 1, out


def test_a_read_without_waiting_finds_our_queue_behind_another_ones() -> None:
    """The relay reads what came in without waiting (``wait(0)``) before it waits on the
    socket again: that read must take every notification in, not none (a wait of 0 s
    read nothing before) and not only another queue's, or ours would sit unread until
    the socket stirs again. (tests/worker/test_wakeup.py has Redis's.)"""
    from django_dbqueue.queue.announce import CHANNEL
    from django_dbqueue.worker import wakeup

    listener = wakeup.listen(["default"])
    assert isinstance(listener, wakeup.PostgresListener)
    try:
        with connection.cursor() as cursor:  # both delivered at the one commit
            cursor.execute("SELECT pg_notify(%s, 'other'), pg_notify(%s, 'default')", [CHANNEL] * 2)
        ready, _, _ = select.select([listener.fileno()], [], [], 30)
        assert ready
        assert listener.wait(0)
    finally:
        listener.close()
