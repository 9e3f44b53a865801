"""Concurrency keys under fire: 4 workers drain 1,000 keyed jobs while children are
SIGKILLed at random and some jobs fail and retry. A probe job records each run's start
and end; per key, the runs never overlap beyond the limit, and nothing is lost or stuck."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from django_dbqueue import enqueue_many
from django_dbqueue.models import ConcurrencyKey, Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.queue.concurrency import PARKED_UNTIL
from tests.support import Processes, jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

TOTAL, KEYS = 1_000, 20
# Enough kills to hit jobs holding slots many times; each costs a child's restart (about
# a second on a loaded machine), so more would mostly measure restarts.
KILLS = 15


def read_runs(directory: Path, killed: dict[int, int]) -> dict[str, list[tuple[int, int]]]:
    """Per key, the (start, end) of every run; a run whose process the test killed ends
    at the kill (its slot is held longer, until the supervisor's recovery)."""
    runs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for path in directory.glob("runs-*.txt"):
        open_runs: dict[tuple[str, str], int] = {}
        pid = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            if len(line.split()) != 5:
                continue  # a line cut short by a SIGKILL
            kind, key, n, stamp, _ = line.split()
            if kind == "start":
                assert (key, n) not in open_runs, f"{key}:{n} started twice in pid {pid}"
                open_runs[(key, n)] = int(stamp)
            else:
                runs[key].append((open_runs.pop((key, n)), int(stamp)))
        for (key, n), start in open_runs.items():
            assert pid in killed, f"{key}:{n} never ended in pid {pid}, which was not killed"
            assert len(open_runs) == 1, "a process runs one job at a time"
            runs[key].append((start, killed[pid]))
    return runs


def peak(intervals: list[tuple[int, int]]) -> int:
    # At one instant an end sorts before a start: the slot was freed at the end.
    events = sorted([(s, 1) for s, _ in intervals] + [(e, 0) for _, e in intervals])
    running = most = 0
    for _, is_start in events:
        running += 1 if is_start else -1
        most = max(most, running)
    return most


def left(unfinished: object) -> str:
    rows = list(
        Job.objects.filter(status__in=[Job.Status.QUEUED, Job.Status.CLAIMED]).values_list(
            "id", "status", "concurrency_key", "run_after", "owner", "attempts"
        )[:20]
    )
    keys = list(ConcurrencyKey.objects.values_list("key", "parked"))
    workers = list(WorkerRow.objects.values_list("role", "pid"))
    return f"jobs left: {rows}; keys: {keys}; workers: {workers}"


@pytest.mark.parametrize("limit", [1, 3])
def test_keyed_drain_under_sigkills_never_exceeds_the_limit(
    limit: int,
    processes: Processes,
    worker_env: Callable[..., dict[str, str]],
    tmp_path: Path,
) -> None:
    rng = random.Random(limit)
    specs = []
    for n in range(TOTAL):
        key = f"k{n % KEYS}"
        specs.append(
            {
                "task": jobs.slot_probe,
                "args": [str(tmp_path), key, n, n % 10 == 0],
                "concurrency_key": key,
                "concurrency_limit": limit,
                "max_attempts": 20,
                "retry_backoff": 0.01,
            }
        )
    rng.shuffle(specs)
    enqueue_many(specs)

    started = time.monotonic()
    proc = processes.run_jobs(
        "--concurrency",
        "4",
        env=worker_env(
            LEASE_TIMEOUT=600, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.05, KILL_GRACE=0.2
        ),
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    unfinished = Job.objects.filter(status__in=[Job.Status.QUEUED, Job.Status.CLAIMED])
    killed: dict[int, int] = {}
    while unfinished.exists():
        assert time.monotonic() - started < 600, left(unfinished)  # stuck, not slow
        time.sleep(rng.uniform(0.2, 0.6))
        if len(killed) >= KILLS:
            continue
        pids = list(
            WorkerRow.objects.filter(role=WorkerRow.Role.CHILD).values_list("pid", flat=True)
        )
        pids = [pid for pid in pids if pid not in killed]
        if pids:
            pid = rng.choice(pids)
            stamp = time.monotonic_ns()
            try:
                os.kill(pid, signal.SIGKILL)
                killed[pid] = stamp
            except ProcessLookupError:
                pass
    drained_in = time.monotonic() - started
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, "".join(output)[-3000:]
    reader.join(10)
    print(f"keys: {TOTAL} jobs, limit {limit}, {drained_in:.1f} s, {len(killed)} SIGKILLs")

    assert len(killed) >= 3, "the drain was too quick to kill anything: nothing was tested"
    runs = read_runs(tmp_path, killed)
    assert sorted(runs) == sorted(f"k{i}" for i in range(KEYS))
    for key, intervals in runs.items():
        assert peak(intervals) <= limit, f"{key}: {peak(intervals)} runs at once"
    if limit > 1:
        assert max(peak(i) for i in runs.values()) > 1, "the limit was never used"

    assert not Job.objects.exclude(status=Job.Status.DONE).exists(), "nothing lost or stuck"
    assert not Job.objects.filter(run_after=PARKED_UNTIL).exists(), "nothing left parked"
    assert not ConcurrencyKey.objects.filter(parked=True).exists(), "no key flagged"
    assert not WorkerRow.objects.exists()
    ends = 0
    for path in tmp_path.glob("runs-*.txt"):
        ends += sum(line.startswith("end ") for line in path.read_text().splitlines())
    failing = TOTAL // 10
    # A failing run killed between its marker and its end makes one end fewer (its retry
    # succeeds, below); a killed child was running at most one job.
    assert ends >= TOTAL + failing - len(killed), "every job ran to its end, failing ones twice"
    retried = [
        pk
        for pk, errors in Job.objects.values_list("pk", "errors")
        if any("first run of" in error["traceback"] for error in errors)
    ]
    # A failing run killed after it made its marker does not fail: its retry succeeds.
    assert failing - len(killed) <= len(retried) <= failing, "failed once, then retried"
