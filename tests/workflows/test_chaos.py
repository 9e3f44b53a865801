"""A 1,000-job graph (chains, fan-out and fan-in, a 500-member batch, chains broken by a
failure) drained by 3 supervisors whose children are SIGKILLed at random: every job
runs after its dependencies, the broken chains are cancelled, every callback fires
exactly once and nothing is left waiting."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from django_dbqueue import enqueue, enqueue_batch
from django_dbqueue.models import Batch, Dependency, Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.workflows.chains import chain, group
from tests.support import Processes, flow_jobs
from tests.support import jobs as test_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

S = Job.Status
KILLS = 12
ON_BATCH = "tests.support.flow_jobs.on_batch"
STEP = {"max_attempts": 20, "retry_backoff": 0.01}


def build_graph(gate: Job) -> tuple[Batch, list[list[Job]]]:
    """Returns the batch and the chains broken by a failure. The fan-outs wait for ``gate``."""
    batch = enqueue_batch(
        [{"task": flow_jobs.value, "args": [n], **STEP} for n in range(500)],
        on_complete={"task": flow_jobs.on_batch, "args": ["complete"]},
        on_success={"task": flow_jobs.on_batch, "args": ["success"]},
        on_failure={"task": flow_jobs.on_batch, "args": ["failure"]},
    )
    for n in range(50):  # 250 jobs in chains of 5
        chain(
            {"task": flow_jobs.value, "args": [n], **STEP},
            *[{"task": flow_jobs.plus_previous, "args": [1], **STEP} for _ in range(4)],
        )
    for n in range(20):  # 240 jobs: root -> 10 in parallel -> sink
        root = enqueue(flow_jobs.value, [n], depends_on=[gate], **STEP)
        fan = group(
            *[{"task": flow_jobs.value, "args": [i], **STEP} for i in range(10)], depends_on=[root]
        )
        enqueue(flow_jobs.sum_dependencies, depends_on=fan, **STEP)
    broken = [
        chain(
            {"task": flow_jobs.value, "args": [n], **STEP},
            {"task": flow_jobs.explode, "max_attempts": 1},
            *[{"task": flow_jobs.plus_previous, "args": [1], **STEP} for _ in range(3)],
        )
        for n in range(5)
    ]
    return batch, broken


def test_a_workflow_graph_survives_sigkilled_children(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    rng = random.Random(29)
    # The gate holds part of the graph until half the kills have landed: a quick drain
    # (two seconds on a quiet machine) would otherwise end before a child restarts.
    opened = tmp_path / "open"
    gate = enqueue(test_jobs.hold_until, [str(opened), "gate", 240], **STEP)
    batch, broken = build_graph(gate)
    total = Job.objects.count()
    assert total >= 1000
    env = worker_env(LEASE_TIMEOUT=600, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.05, KILL_GRACE=0.2)
    began = time.monotonic()
    procs = [processes.run_jobs("--concurrency", "2", env=env) for _ in range(3)]
    output: list[str] = []
    for proc in procs:
        threading.Thread(target=lambda p=proc: output.extend(p.stdout or []), daemon=True).start()
    active = Job.objects.filter(status__in=[S.QUEUED, S.CLAIMED, S.WAITING])
    killed: set[int] = set()
    while active.exists() or not Job.objects.filter(task=ON_BATCH, status=S.DONE).exists():
        left = list(active.values_list("id", "status", "task")[:10])
        assert time.monotonic() - began < 300, f"stuck: {left}; " + "".join(output)[-2000:]
        # Often enough to land several kills in a drain of two seconds (a quiet machine).
        time.sleep(rng.uniform(0.05, 0.2))
        if len(killed) >= KILLS // 2:
            opened.touch()
        if len(killed) < KILLS:
            pids = [
                p
                for p in WorkerRow.objects.filter(role=WorkerRow.Role.CHILD).values_list(
                    "pid", flat=True
                )
                if p not in killed
            ]
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
    took = time.monotonic() - began
    time.sleep(1.0)  # a callback enqueued twice would show by now (none may)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, "".join(output)[-3000:]
    print(f"chaos: {total} jobs in {took:.1f} s, {len(killed)} SIGKILLs")
    assert len(killed) >= KILLS // 2, "the gate opens after half the kills"

    # Every callback exactly once, with the batch's counts.
    callbacks = {
        tag: [j for j in Job.objects.filter(task=ON_BATCH) if j.args == [tag]]
        for tag in ("complete", "success", "failure")
    }
    assert [len(callbacks[t]) for t in ("complete", "success", "failure")] == [1, 1, 0]
    assert callbacks["complete"][0].result["done"] == 500
    batch.refresh_from_db()
    assert (batch.done, batch.failed, batch.cancelled) == (500, 0, 0)

    # Every job ran after each of its dependencies ended DONE; broken chains cancelled.
    jobs = {j.id: j for j in Job.objects.all()}
    for edge in Dependency.objects.all():
        job, dep = jobs[edge.job_id], jobs[edge.depends_on_id]
        if dep.status == S.DONE:
            assert job.status in (S.DONE, S.FAILED), (job, dep)  # it ran (explode fails)
            assert job.started_at >= dep.finished_at, (job, dep)
        else:
            assert job.status == S.CANCELLED and job.started_at is None, (job, dep)
    for steps in broken:
        assert [jobs[j.id].status for j in steps] == ["done", "failed", *["cancelled"] * 3]
    assert not Job.objects.exclude(status__in=[S.DONE, S.FAILED, S.CANCELLED]).exists()
    assert Job.objects.filter(status=S.DONE).count() == total + 2 - 5 * 4
