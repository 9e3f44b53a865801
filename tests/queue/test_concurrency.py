"""Concurrency keys: at most concurrency_limit claimed jobs per key, whatever happens."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import pytest
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import ConcurrencyKey, Job
from django_dbqueue.queue.finish import finish_failed_attempt, give_back
from django_dbqueue.queue.keys import PARKED_UNTIL, release_parked
from testproject.models import Execution
from tests.support import Processes, jobs, wait_until

S = Job.Status


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM and wait: a SIGKILLed supervisor's children could outlive the test."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


def claim(owner: str = "w1", n: int = 10) -> list[Job]:
    return Job.objects.claim(owner, n)


@pytest.mark.django_db
def test_only_limit_jobs_of_a_key_are_claimed_and_the_rest_park_without_attempts() -> None:
    keyed = [enqueue(jobs.noop, concurrency_key="customer:42") for _ in range(3)]
    other = enqueue(jobs.noop)

    claimed = claim()

    assert sorted(j.pk for j in claimed) == sorted([keyed[0].pk, other.pk])
    parked = Job.objects.filter(pk__in=[keyed[1].pk, keyed[2].pk])
    assert {(j.status, j.attempts, j.run_after) for j in parked} == {(S.QUEUED, 0, PARKED_UNTIL)}
    assert ConcurrencyKey.objects.get(key="customer:42").parked
    assert claim("w2") == [], "parked jobs are not claimed, nor read again"


@pytest.mark.django_db
def test_a_limit_of_two_claims_two() -> None:
    for _ in range(5):
        enqueue(jobs.noop, concurrency_key="k", concurrency_limit=2)
    assert len(claim()) == 2
    assert Job.objects.filter(status=S.CLAIMED).count() == 2


@pytest.mark.django_db
def test_job_defaults_format_the_key_from_the_arguments() -> None:
    job = enqueue(jobs.keyed_probe, args=["acme", 1])
    assert (job.concurrency_key, job.concurrency_limit) == ("probe:acme", 1)
    explicit = enqueue(jobs.keyed_probe, args=["acme", 2], concurrency_key="mine")
    assert explicit.concurrency_key == "mine"


def free_done(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(status=S.DONE, finished_at=timezone.now())


def free_retry(job: Job) -> None:
    job.refresh_from_db()
    assert finish_failed_attempt(Job, "default", "w1", job, "boom", "E") == S.QUEUED


def free_give_back(job: Job) -> None:
    assert give_back(Job, "default", "w1", [job.pk]) == 1


def free_cancel(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(status=S.CANCELLED, finished_at=timezone.now())


def free_delete(job: Job) -> None:
    Job.objects.filter(pk=job.pk).delete()


def free_lease_expiry(job: Job) -> None:
    from django_dbqueue.queue.leases import recover_expired

    Job.objects.filter(pk=job.pk).update(owner_date=timezone.now() - timezone.timedelta(hours=1))
    assert recover_expired(Job, "default", lease_timeout=1.0) != (0, 0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "leave",
    [free_done, free_retry, free_give_back, free_cancel, free_delete, free_lease_expiry],
)
def test_every_way_out_of_claimed_frees_the_slot_once(leave: Callable[[Job], None]) -> None:
    first = enqueue(jobs.noop, concurrency_key="k", max_attempts=5)
    second = enqueue(jobs.noop, concurrency_key="k", max_attempts=5)
    [running] = claim()
    assert running.pk == first.pk
    assert claim() == []

    leave(running)
    assert release_parked(Job, "default", lock=False, force=True) == 1

    again = claim()
    assert len(again) == 1, "one slot, one job"
    assert claim() == []
    assert Job.objects.filter(concurrency_key="k", status=S.CLAIMED).count() == 1
    if leave is not free_retry and leave is not free_give_back and leave is not free_lease_expiry:
        assert again[0].pk == second.pk


@pytest.mark.django_db
def test_a_limit_without_a_key_is_refused() -> None:
    with pytest.raises(InvalidJob, match="concurrency_limit needs a concurrency_key"):
        enqueue(jobs.noop, concurrency_limit=2)


@pytest.mark.django_db
def test_a_zero_limit_is_refused() -> None:
    with pytest.raises(InvalidJob, match="concurrency_limit must be between 1"):
        enqueue(jobs.noop, concurrency_key="k", concurrency_limit=0)


@pytest.mark.django_db
def test_a_key_template_that_does_not_fit_the_arguments_is_refused() -> None:
    with pytest.raises(InvalidJob, match="cannot be formatted"):
        enqueue(jobs.keyed_probe, kwargs={"key": "a", "n": 1})


def test_workers_never_run_more_than_the_limit_and_lose_nothing(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    keys, per_key = ["a", "b", "c"], 8
    for n in range(per_key):
        for key in keys:
            enqueue(jobs.keyed_probe, args=[key, n, n % 3 == 0], retry_backoff=0.1)
    env = worker_env(POLL_INTERVAL=0.1)
    workers = [
        processes.run_jobs("--concurrency", "2", "--batch-size", "4", env=env) for _ in range(3)
    ]

    total = len(keys) * per_key
    wait_until(lambda: Job.objects.filter(status=S.DONE).count() == total, timeout=240)
    for proc in workers:
        stop(proc)

    assert not Job.objects.exclude(status=S.DONE).exists(), "nothing lost or stuck"
    for key in keys:
        events = []
        for row in Execution.objects.filter(key__regex=rf"^(start|end):{key}:"):
            kind = row.key.split(":")[0]
            # At one instant an end sorts before a start: the slot is held past the end.
            events.append((row.created_at, 0 if kind == "end" else 1))
        running = peak = 0
        for _, kind in sorted(events):
            running += 1 if kind else -1
            peak = max(peak, running)
        assert peak == 1, f"key {key}: {peak} runs at once"
        starts = sum(1 for _, kind in events if kind)
        assert starts == per_key + len(range(0, per_key, 3)), "every failure was retried once"


def test_a_child_killed_while_holding_the_slot_frees_it(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    from tests.worker import hostile

    crash = enqueue(hostile.segfault, concurrency_key="probe:z", max_attempts=2, retry_backoff=0)
    for n in range(3):
        enqueue(jobs.keyed_probe, args=["z", n])
    env = worker_env(LEASE_TIMEOUT=600, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.2)
    proc = processes.run_jobs("--concurrency", "2", env=env)

    wait_until(lambda: Job.objects.filter(status=S.DONE).count() == 3, timeout=120)
    wait_until(lambda: Job.objects.get(pk=crash.pk).status == S.FAILED, timeout=60)
    stop(proc)

    crash.refresh_from_db()
    assert crash.attempts == 2, "each death freed the slot for the retry and the others"
    assert not Job.objects.filter(status__in=[S.CLAIMED, S.QUEUED]).exists()


@pytest.mark.django_db
def test_enqueue_many_takes_concurrency_keys() -> None:
    from django_dbqueue import enqueue_many

    enqueue_many([{"task": jobs.noop, "concurrency_key": "bulk"} for _ in range(4)])
    assert ConcurrencyKey.objects.filter(key="bulk").exists()
    assert len(claim()) == 1


@pytest.mark.django_db
def test_a_parked_job_can_be_cancelled_by_the_operator() -> None:
    enqueue(jobs.noop, concurrency_key="k")
    waiting = enqueue(jobs.noop, concurrency_key="k")
    claim()
    assert Job.objects.filter(pk=waiting.pk).cancel() == (1, 0)  # type: ignore[attr-defined]
    assert release_parked(Job, "default", lock=False, force=True) == 0
    assert not ConcurrencyKey.objects.get(key="k").parked


@pytest.mark.django_db
def test_retention_deletes_the_rows_of_keys_no_waiting_or_running_job_uses() -> None:
    from django_dbqueue.queue.keys import prune_keys
    from django_dbqueue.scheduling.retention import prune_if_due

    finished = enqueue(jobs.noop, concurrency_key="finished")
    Job.objects.filter(pk=finished.pk).update(status=S.DONE, finished_at=timezone.now())
    enqueue(jobs.noop, concurrency_key="running")
    enqueue(jobs.noop, concurrency_key="running")  # parked behind it
    enqueue(jobs.noop, concurrency_key="waiting", run_after=3600)
    ConcurrencyKey.objects.create(key="unused")
    assert len(claim()) == 1

    assert prune_keys("default", batch_size=2) == 2, "two per batch, every batch read"
    assert sorted(ConcurrencyKey.objects.values_list("key", flat=True)) == ["running", "waiting"]

    Job.objects.filter(concurrency_key="running", status=S.CLAIMED).update(status=S.DONE)
    release_parked(Job, "default", lock=False, force=True)
    assert [j.concurrency_key for j in claim()] == ["running"]
    Job.objects.filter(concurrency_key__in=["running", "waiting"]).update(status=S.DONE)
    assert prune_if_due() == 0, "no old job to delete, but the keys go in the same turn"
    assert not ConcurrencyKey.objects.exists()


@pytest.mark.django_db
def test_a_key_whose_row_was_pruned_meanwhile_keeps_its_limit() -> None:
    from django_dbqueue.queue.keys import prune_keys

    jobs_ = [enqueue(jobs.noop, concurrency_key="late") for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs_]).update(status=S.DONE)
    assert prune_keys("default", batch_size=10) == 1
    # Enqueued before the prune saw them (their ensure_keys found the row), inserted after.
    Job.objects.filter(pk__in=[j.pk for j in jobs_]).update(status=S.QUEUED)
    assert len(claim()) == 1, "the claim makes the key's row again and counts"
    assert ConcurrencyKey.objects.get(key="late").parked


@pytest.mark.django_db
def test_release_takes_turns_over_more_flagged_keys_than_one_call_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_dbqueue.queue import keys as keys_module

    monkeypatch.setattr(keys_module, "RELEASE_KEYS_PER_CALL", 2)
    monkeypatch.setattr(keys_module, "_release_cursor", {})
    for key in "abc":
        for _ in range(3):
            enqueue(jobs.noop, concurrency_key=key)
    assert len(claim()) == 3
    Job.objects.filter(status=S.CLAIMED).update(status=S.DONE)

    def runnable() -> list[str]:
        queued = Job.objects.filter(status=S.QUEUED).exclude(run_after=PARKED_UNTIL)
        return sorted(queued.values_list("concurrency_key", flat=True))

    assert release_parked(Job, "default", lock=False, force=True) == 2
    assert runnable() == ["a", "b"]
    release_parked(Job, "default", lock=False, force=True)
    assert "c" in runnable(), "the next call starts after b, not at a again"
