"""One claim stream per host: a supervisor's children claim in turn (worker/turns.py).

The database then sees one claim at a time from a host, each taking a whole batch of what
is left; a child killed while holding jobs still has only its own jobs settled; and
supervisors sharing a queue each drain their share."""

from __future__ import annotations

import os
import signal
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue import clock
from django_dbqueue.worker.supervisor import Supervisor
from django_dbqueue.worker.turns import CONTENDED_PAUSE_MAX, TURNS_FROM, contended_pause
from testproject.models import Execution
from tests.support import CURRENT_VENDOR, Processes, counted_claims, jobs, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# Statements of one claim that took jobs: the clock (now and then), concurrency keys'
# parked jobs (now and then), the candidates, BEGIN, the locking read(s), the UPDATE,
# COMMIT. Measured: 4 to 7.
STATEMENTS_PER_CLAIM = 9


def test_a_host_with_many_children_claims_one_batch_at_a_time(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    total, children = 3000, 8
    enqueue_many({"task": jobs.noop} for _ in range(total))
    log = str(tmp_path / "claims")
    # CLAIM_AHEAD = 0: every claim asks for a whole batch (100), whatever the jobs took.
    env = worker_env(CLAIM_AHEAD=0)
    proc = counted_claims.start(processes, log, "--burst", "--concurrency", str(children), env=env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert Job.objects.filter(status=Job.Status.DONE).count() == total
    claims = counted_claims.read(log)
    taking = [claim for claim in claims if claim[1]]
    assert sum(claim[1] for claim in taking) == total
    # In turn, each claim reads past what the last one took: 30 claims of 100. Children
    # claiming at once read the same candidates and split them (or lock nothing).
    assert len(taking) == total // 100, Counter(claim[1] for claim in taking)
    # Not one claim transaction that locked nothing.
    assert sum(claim[3] for claim in claims) == 0
    # Taking jobs or finding none (on SQLite an empty claim is a transaction too).
    statements = [claim[0] for claim in claims]
    assert max(statements) <= STATEMENTS_PER_CLAIM, statements


def test_a_child_killed_while_holding_jobs_has_only_its_own_jobs_settled(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    ids = [
        job.pk
        for job in enqueue_many(
            {"task": jobs.hold_until, "args": [str(gate), f"k{n}"]} for n in range(10)
        )
    ]
    # Batches of 5: each child claims five jobs and runs the first, held at the gate.
    proc = processes.run_jobs(
        "--concurrency", "2", env=worker_env(CLAIM_AHEAD=0, BATCH_SIZE=5, RETRY_BACKOFF=60)
    )
    wait_until(lambda: Execution.objects.count() == 2)
    held = Counter(Job.objects.filter(status=Job.Status.CLAIMED).values_list("owner", flat=True))
    assert sorted(held.values()) == [5, 5], held
    victim, other = sorted(held)
    victim_jobs = list(Job.objects.filter(owner=victim).order_by("pk").values_list("pk", flat=True))
    other_jobs = list(Job.objects.filter(owner=other).order_by("pk").values_list("pk", flat=True))
    assert sorted(victim_jobs + other_jobs) == ids
    os.kill(int(victim.split(":")[1]), signal.SIGKILL)

    def settled() -> bool:
        return not Job.objects.filter(owner=victim, status=Job.Status.CLAIMED).exists()

    wait_until(settled)
    running, *unstarted = Job.objects.filter(pk__in=victim_jobs).order_by("pk")
    # Its running job: a failed attempt, naming the death; the rest back, uncharged (a
    # new child may have claimed them since: one attempt, its own).
    assert "WorkerDied" in running.last_error and victim in running.last_error
    assert running.status == Job.Status.QUEUED and running.attempts == 1
    for job in unstarted:
        assert job.last_error == ""
        if job.status == Job.Status.CLAIMED:
            assert job.owner != victim and job.attempts == 1
        else:
            assert (job.status, job.attempts) == (Job.Status.QUEUED, 0)
    # The other child's jobs: untouched, still its own.
    for job in Job.objects.filter(pk__in=other_jobs):
        assert (job.owner, job.status, job.attempts, job.last_error) == (
            other,
            Job.Status.CLAIMED,
            1,
            "",
        )
    gate.touch()
    wait_until(lambda: Job.objects.filter(pk__in=other_jobs, status=Job.Status.DONE).count() == 5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert set(Job.objects.filter(pk__in=other_jobs).values_list("owner", "attempts")) == {
        (other, 1)
    }


# SQLite serves one host: its claims queue on the database's write lock, whose busy
# handler (a sleep, growing) is not fair between processes; a third supervisor drained
# 7% of a drain there.
@pytest.mark.only_vendor("mysql", "postgresql")
def test_three_supervisors_each_drain_at_least_a_fifth(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    total = 6000
    # Idle children poll every 50 ms: where no wake-up reaches them (SQLite without
    # Redis), a drain may be over within one of the default poll intervals.
    env = worker_env(POLL_INTERVAL=0.05)
    supervisors = [processes.run_jobs("--concurrency", "2", env=env) for _ in range(3)]
    # Jobs only once every child of the three is registered: none gets a head start.
    wait_until(lambda: WorkerProcess.objects.filter(role=WorkerProcess.Role.CHILD).count() == 6)
    host_of = dict(
        WorkerProcess.objects.filter(role=WorkerProcess.Role.CHILD).values_list(
            "name", "supervisor"
        )
    )
    assert len(set(host_of.values())) == 3
    enqueue_many({"task": jobs.noop} for _ in range(total))
    done = Job.objects.filter(status=Job.Status.DONE)
    wait_until(lambda: done.count() == total, timeout=600)
    for proc in supervisors:
        proc.send_signal(signal.SIGTERM)
    for proc in supervisors:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    shares = Counter(host_of[owner] for owner in done.values_list("owner", flat=True))
    assert len(shares) == 3, shares
    assert min(shares.values()) >= 0.2 * total, f"a host idled: {shares}"


def test_a_contended_claim_waits_a_jittered_growing_pause() -> None:
    firsts = {contended_pause(1) for _ in range(50)}
    assert len(firsts) > 1  # jittered: claimers that collided do not meet again
    assert all(0 < pause <= 2 * min(firsts) for pause in firsts)
    assert min(contended_pause(4) for _ in range(50)) > max(firsts)  # grows
    assert max(contended_pause(50) for _ in range(50)) <= CONTENDED_PAUSE_MAX  # bounded


def test_supervisors_of_few_children_give_them_no_turn() -> None:
    """Two children collide too seldom to pay for waiting on each other (TURNS_FROM)."""
    assert Supervisor(TURNS_FROM - 1, {}).options["claim_turns"] is None
    many = Supervisor(TURNS_FROM, {})
    assert many.options["claim_turns"] is many.turns is not None


def test_a_killed_supervisor_leaves_no_claim_turn_file(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    """The turn is a file with no name (opened again through /proc): nothing is left in
    the temporary directory, while the supervisor runs or after a SIGKILL."""
    proc = processes.run_jobs("--concurrency", str(TURNS_FROM), env=worker_env())
    job = enqueue_many([{"task": jobs.noop}])[0]
    wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.DONE, timeout=120)

    def left() -> list[str]:
        return [
            name
            for name in os.listdir(tempfile.gettempdir())
            if name.startswith(f"dbqueue-claim-turn-{proc.pid}-")
        ]

    assert left() == []
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert left() == []


@pytest.mark.parametrize("children", [4, 8, 16])
@pytest.mark.parametrize("away", [0.0, 0.010], ids=["near", "far"])
def test_which_claims_take_turns(
    monkeypatch: pytest.MonkeyPatch, children: int, away: float
) -> None:
    """Claims reading candidates take turns (they collide); one queue's locking walk
    along the claim index does not collide, and takes turns only on MariaDB/MySQL from
    8 children on (16 walking at once cost that server more than in turn). MariaDB next
    to its workers (under 2 ms) reads candidates first, and takes turns."""
    monkeypatch.setattr(clock, "round_trip", lambda using: away)
    several = ["default", "emails"]
    assert Job.objects.claims_take_turns(several, children)
    along = Job.objects.claims_take_turns(["default"], children)
    if CURRENT_VENDOR == "mysql":
        assert along is (away < 0.002 or children >= 8)
    elif CURRENT_VENDOR == "postgresql":
        assert along is False
    else:  # SQLite: no locking reads, every claim in one transaction, in turn
        assert along is True
