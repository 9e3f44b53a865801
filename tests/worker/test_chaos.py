"""A drain full of hostile jobs while children are SIGKILLed at random: nobody else pays."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from tests.support import Processes
from tests.worker import hostile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

TOTAL = int(os.environ.get("CHAOS_TOTAL", 10_000))
# Bad jobs: (task, args, timeout, how each of its attempts must be recorded), and how many.
BAD = {
    "exit": (hostile.exit_hard, [1], None, "exited with code 1", 60),
    "segfault": (hostile.segfault, [], None, "was killed by signal 11 (SIGSEGV)", 60),
    "system_exit": (hostile.raise_system_exit, [], None, "SystemExit: 3", 60),
    "overrun": (hostile.sleep_past_timeout, [30], 0.1, "JobTimeout", 20),
    "overrun_in_c": (hostile.ignore_alarm, [30], 0.1, "did not stop within 0.2 s", 10),
}


def test_chaos_drain(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    rng = random.Random(12)
    specs: list[dict[str, object]] = []
    bad_kind: dict[int, str] = {}  # position in specs -> kind
    for kind, (task, args, timeout, _, count) in BAD.items():
        for _ in range(count):
            bad_kind[len(specs)] = kind
            specs.append(
                {
                    "task": task,
                    "args": args,
                    "timeout": timeout,
                    "max_attempts": 2,
                    "retry_backoff": 0.05,
                }
            )
    innocents = TOTAL - len(specs)
    specs += [
        {"task": hostile.note, "args": [str(tmp_path), f"i{n}"], "max_attempts": 5}
        for n in range(innocents)
    ]
    order = list(range(len(specs)))
    rng.shuffle(order)
    created = enqueue_many(specs[i] for i in order)
    kind_of = {job.pk: bad_kind.get(i) for job, i in zip(created, order, strict=True)}

    started = time.monotonic()
    proc = processes.run_jobs(
        "--concurrency",
        "2",
        env=worker_env(
            LEASE_TIMEOUT=600, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.1, KILL_GRACE=0.2
        ),
    )
    # Hundreds of deaths make a lot of log lines: read them as they come, or the
    # supervisor blocks writing to a full pipe.
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    unfinished = Job.objects.filter(status__in=[Job.Status.QUEUED, Job.Status.CLAIMED])
    kills = 0
    while unfinished.exists():
        assert time.monotonic() - started < 300, f"{unfinished.count()} jobs left"
        time.sleep(rng.uniform(0.1, 0.5))
        pids = list(
            WorkerRow.objects.filter(role=WorkerRow.Role.CHILD).values_list("pid", flat=True)
        )
        if pids:
            try:
                os.kill(rng.choice(pids), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass  # died of a bad job meanwhile
    drained_in = time.monotonic() - started
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    reader.join(10)
    out = "".join(output)
    assert "Finished:" in out, out[-3000:]
    print(f"chaos: {TOTAL} jobs drained in {drained_in:.1f} s with {kills} SIGKILLs")

    runs: Counter[str] = Counter()
    for path in tmp_path.glob("runs-*.txt"):
        runs.update(path.read_text().split())
    rows = Job.objects.values_list("id", "status", "attempts", "last_error", "errors", "args")
    killed_by_test = "killed by signal 9 (SIGKILL)"
    charged_by_test = 0  # attempts charged because the test killed the job's process
    shown: Counter[str] = Counter()  # bad jobs with their own reason recorded, per kind
    for job_id, status, attempts, last_error, errors, args in rows:
        kind = kind_of[job_id]
        charged_by_test += sum(killed_by_test in e["traceback"] for e in errors)
        if kind is None:
            key = args[1]
            assert status == Job.Status.DONE, (key, last_error)
            if attempts == 1:
                assert runs[key] == 1, (key, runs[key])
                assert last_error == "" and errors == []
            else:
                # Running when the test SIGKILLed its process: that attempt counts.
                assert len(errors) == attempts - 1, errors
                assert all(killed_by_test in e["traceback"] for e in errors), errors
                assert 1 <= runs[key] <= attempts
            continue
        reason = BAD[kind][3]
        assert (status, attempts, len(errors)) == (Job.Status.FAILED, 2, 2), (kind, errors)
        assert all(reason in e["traceback"] or killed_by_test in e["traceback"] for e in errors)
        if any(reason in e["traceback"] for e in errors):
            shown[kind] += 1
    # Each SIGKILL of the test charged at most the one job its process was running.
    assert charged_by_test <= kills
    # Long-running bad jobs are the likeliest to be hit by the test's kills (more so on
    # a loaded machine), so only ask that each kind showed its own reason somewhere.
    print(f"chaos: bad jobs showing their own reason: {dict(shown)}")
    assert set(shown) == set(BAD), shown
    assert not Job.objects.exclude(status__in=[Job.Status.DONE, Job.Status.FAILED]).exists()
    assert not WorkerRow.objects.exists()
