"""One claimer per host: a supervisor of many children claims for them all and hands
the jobs out (worker/handout.py).

The database then sees one claim stream per host, each claim serving every child that
asked meanwhile; each job is still claimed under the name of the child that runs it, so
a child killed while holding jobs has only its own jobs settled; supervisors sharing a
queue each drain their share; a child gone before its jobs reach it loses none of them.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import OperationalError

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue.shares import Shares
from django_dbqueue.worker import handout
from django_dbqueue.worker.handout import (
    CONTENDED_PAUSE_MAX,
    HAND_OUT_FROM,
    HostClaims,
    contended_pause,
)
from django_dbqueue.worker.supervisor import Supervisor
from testproject.models import Execution
from tests.support import CURRENT_VENDOR, Processes, counted_claims, jobs, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# Statements of one claim that took jobs: the clock (now and then), concurrency keys'
# parked jobs (now and then), the candidates, BEGIN, the locking read(s), the UPDATE,
# COMMIT. Measured: 4 to 7.
STATEMENTS_PER_CLAIM = 9
SERVERS = pytest.mark.only_vendor("mysql", "postgresql")


def test_a_host_with_many_children_claims_for_them_all(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    total, children = 3000, 8
    enqueue_many({"task": jobs.noop} for _ in range(total))
    log = str(tmp_path / "claims")
    # CLAIM_AHEAD = 0: every child asks for a whole batch (100), whatever the jobs took.
    env = worker_env(CLAIM_AHEAD=0)
    proc = counted_claims.start(processes, log, "--burst", "--concurrency", str(children), env=env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    done = Job.objects.filter(status=Job.Status.DONE)
    assert done.count() == total
    # Every job was run by a child of the host, under its own name.
    owners = Counter(done.values_list("owner", flat=True))
    children_rows = WorkerProcess.objects.filter(role=WorkerProcess.Role.CHILD)
    assert not children_rows.exists()  # rows removed on exit: the names are in the jobs
    assert len(owners) > 1, owners
    claims = counted_claims.read(log)
    taking = [claim for claim in claims if claim[1]]
    assert sum(claim[1] for claim in taking) == total
    if CURRENT_VENDOR == "sqlite":
        # SQLite: each child claims its own batch, the claims queued on the write lock.
        assert max(claim[1] for claim in taking) <= 100
        assert len(taking) == total // 100, Counter(claim[1] for claim in taking)
        assert proc.pid not in {claim[4] for claim in claims}
    else:
        # One claim serves every child that asked meanwhile: claims of several batches,
        # fewer claims than batches, up to MOST_AT_ONCE batches each.
        assert max(claim[1] for claim in taking) > 100, Counter(c[1] for c in taking)
        assert max(claim[1] for claim in taking) <= handout.MOST_AT_ONCE * 100
        assert len(taking) < total // 100, Counter(claim[1] for claim in taking)
        assert {claim[4] for claim in claims} == {proc.pid}, "the supervisor's claims only"
    # One claimer: not one claim transaction that locked nothing while jobs were left;
    # a claim that found the queue empty (the drain's end) answered every child waiting.
    assert sum(claim[3] for claim in taking) == 0
    assert len(claims) - len(taking) <= children, claims
    statements = [claim[0] for claim in claims]
    assert max(statements) <= STATEMENTS_PER_CLAIM, statements


@pytest.mark.parametrize("children", [2, HAND_OUT_FROM])
def test_a_child_killed_while_holding_jobs_has_only_its_own_jobs_settled(
    processes: Processes,
    worker_env: Callable[..., dict[str, str]],
    tmp_path: Path,
    children: int,
) -> None:
    gate = tmp_path / "open"
    ids = [
        job.pk
        for job in enqueue_many(
            {"task": jobs.hold_until, "args": [str(gate), f"k{n}"]} for n in range(5 * children)
        )
    ]
    # Batches of 5: each child gets five jobs (claimed by itself, or for it by the
    # supervisor: HAND_OUT_FROM) and runs the first, held at the gate.
    env = worker_env(CLAIM_AHEAD=0, BATCH_SIZE=5, RETRY_BACKOFF=60)
    proc = processes.run_jobs("--concurrency", str(children), env=env)
    wait_until(lambda: Execution.objects.count() == children)
    held = Counter(Job.objects.filter(status=Job.Status.CLAIMED).values_list("owner", flat=True))
    assert sorted(held.values()) == [5] * children, held
    victim, *others = sorted(held)
    victim_jobs = list(Job.objects.filter(owner=victim).order_by("pk").values_list("pk", flat=True))
    owner_of = dict(Job.objects.filter(owner__in=others).values_list("pk", "owner"))
    other_jobs = sorted(owner_of)
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
    # The other children's jobs: untouched, each still its own.
    for job in Job.objects.filter(pk__in=other_jobs):
        assert (job.owner, job.status, job.attempts, job.last_error) == (
            owner_of[job.pk],
            Job.Status.CLAIMED,
            1,
            "",
        )
    gate.touch()
    done = Job.objects.filter(pk__in=other_jobs, status=Job.Status.DONE)
    wait_until(lambda: done.count() == len(other_jobs))
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert dict(done.values_list("pk", "owner")) == owner_of
    assert set(done.values_list("attempts", flat=True)) == {1}


# SQLite serves one host: its claims queue on the database's write lock, whose busy
# handler (a sleep, growing) is not fair between processes; a third supervisor drained
# 7% of a drain there.
@SERVERS
@pytest.mark.parametrize("children", [2, HAND_OUT_FROM])
def test_three_supervisors_each_drain_at_least_a_fifth(
    processes: Processes, worker_env: Callable[..., dict[str, str]], children: int
) -> None:
    total = 6000
    # Idle children poll every 50 ms: where no wake-up reaches them (SQLite without
    # Redis), a drain may be over within one of the default poll intervals. Batches of
    # 25: a host's claim of 4 children's batches of 100 would be a fifteenth of the
    # drain, and a host that the machine's load held back for two claims fell short.
    env = worker_env(POLL_INTERVAL=0.05, BATCH_SIZE=25)
    supervisors = [processes.run_jobs("--concurrency", str(children), env=env) for _ in range(3)]
    # Jobs only once every child of the three is registered: none gets a head start.
    children_rows = WorkerProcess.objects.filter(role=WorkerProcess.Role.CHILD)
    wait_until(lambda: children_rows.count() == 3 * children)
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


def test_supervisors_of_many_children_claim_for_them() -> None:
    """Two children collide too seldom to pay for a hop through the supervisor; from
    HAND_OUT_FROM on, a server database's supervisor claims. SQLite never: its claims
    queue on the write lock and cannot collide."""
    assert Supervisor(HAND_OUT_FROM - 1, {}).claims is None
    many = Supervisor(HAND_OUT_FROM, {}).claims
    assert (many is not None) is (CURRENT_VENDOR != "sqlite")


def test_a_claim_for_several_workers_gives_each_its_share_in_asking_order() -> None:
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(10))]
    shares = Shares([("a", 3), ("b", 0), ("c", 5), ("d", 4)])
    claimed = Job.objects.claim(shares, shares.total, ["default"])
    # 10 jobs for 12 asked: the askers in order, d gets what is left.
    assert [job.owner for job in claimed] == ["a"] * 3 + ["c"] * 5 + ["d"] * 2
    assert [job.pk for job in claimed] == ids
    rows = dict(Job.objects.values_list("pk", "owner"))
    assert {pk: rows[pk] for pk in ids} == {job.pk: job.owner for job in claimed}
    assert set(Job.objects.values_list("status", "attempts")) == {(Job.Status.CLAIMED, 1)}
    with pytest.raises(ValueError, match="asks once"):
        Shares([("a", 1), ("a", 2)])


@pytest.fixture
def claims() -> Iterator[HostClaims]:
    host = HostClaims(batch_size=100)
    yield host
    host.stop()


def test_jobs_claimed_for_a_child_gone_meanwhile_go_back_at_once(claims: HostClaims) -> None:
    """The supervisor marks a child gone before it settles its jobs; the claimer looks
    at the mark after its claim's COMMIT, and gives back what it claimed for it."""
    enqueue_many({"task": jobs.noop} for _ in range(7))
    side = claims.open(0)  # left open: a send would succeed (the dead child's buffer)
    claims.started(0, "host:1:gone")
    link = claims._links[0]
    request = handout._Request(link, 5, ("default",))
    claims.gone(0)
    claims._serve([request])
    # Back, runnable, the claim's attempt not counted: as if never claimed.
    assert set(Job.objects.values_list("status", "attempts")) == {(Job.Status.QUEUED, 0)}
    assert Job.objects.filter(owner="host:1:gone").count() == 5
    side.close()


def test_a_childs_claim_is_served_through_its_pipe(
    claims: HostClaims, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue_many({"task": jobs.noop} for _ in range(7))
    child = claims.open(0)
    claims.started(0, "host:1:child")
    claims.start()
    got = child.claim("host:1:child", 5, ["default"])
    assert len(got) == 5 and not got.contended
    assert {job.owner for job in got} == {"host:1:child"}
    assert all(job.status == Job.Status.CLAIMED and job.attempts == 1 for job in got)
    in_table = Job.objects.filter(owner="host:1:child", status=Job.Status.CLAIMED)
    assert sorted(in_table.values_list("pk", flat=True)) == sorted(job.pk for job in got)
    # The rest, though more is asked for: the claim found 2.
    assert len(child.claim("host:1:child", 5, ["default"])) == 2
    assert child.claim("host:1:child", 5, ["default"]) == []

    def fails(*args: object, **kwargs: object) -> None:
        raise OperationalError("server has gone away")

    # A database error reaches the child as itself: it waits it out as its own.
    monkeypatch.setattr(type(Job.objects), "claim", fails)
    with pytest.raises(OperationalError, match="gone away"):
        child.claim("host:1:child", 5, ["default"])
    child.close()


def test_a_child_left_without_jobs_by_a_short_claim_is_served_by_the_next(
    claims: HostClaims,
) -> None:
    """A claim that found fewer jobs than were asked for (other hosts took some of what
    it saw) answers the children it filled; one it left with none is not told "empty"
    (a --burst child would exit with jobs left): it is first in line for the next claim.
    A claim that finds nothing answers every child waiting for those queues at once."""
    enqueue_many({"task": jobs.noop} for _ in range(2))
    sides = [claims.open(index) for index in range(3)]
    for index in range(3):
        claims.started(index, f"host:1:c{index}")
    links = [claims._links[index] for index in range(3)]
    first, second = (handout._Request(link, 2, ("default",)) for link in links[:2])
    third = handout._Request(links[2], 2, ("default",))
    claims._pending = [third]  # waiting meanwhile: not in this claim
    claims._serve([first, second])
    assert [side._conn.poll(0) for side in sides] == [True, False, False]
    assert len(sides[0]._conn.recv()[2]) == 2
    assert claims._pending == [second, third]
    claims._serve(claims._next_claim())  # nothing left: both are answered, one claim
    assert claims._pending == []
    answers = [side._conn.recv() for side in sides[1:]]
    assert [(rows, contended) for _, _, rows, contended in answers] == [([], False)] * 2
    for side in sides:
        side.close()
