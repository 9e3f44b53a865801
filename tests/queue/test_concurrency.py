"""Concurrency keys: at most concurrency_limit claimed jobs per key, whatever happens."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import ConcurrencyKey, Job, WorkerProcess
from django_dbqueue.queue import claim_statement
from django_dbqueue.queue.concurrency import PARKED_UNTIL, release_parked
from django_dbqueue.queue.finish import (
    cancel_claimed,
    finish_done,
    finish_failed_attempt,
    give_back,
    retry_later,
)
from testproject.models import Execution
from tests.support import CURRENT_VENDOR, Processes, jobs, wait_until

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


def free_finish_done(job: Job) -> None:
    assert finish_done(Job, "default", "w1", [job]) == {job.pk}


def free_cancel_claimed(job: Job) -> None:
    assert cancel_claimed(Job, "default", "w1", job, "stopped")


def free_retry_later(job: Job) -> None:
    assert retry_later(Job, "default", "w1", job, 60, "later")


# The worker's own writes release the key's parked jobs themselves (queue/finish.py);
# the others are left to release_parked, before the next claims.
RELEASE_THEMSELVES = (free_retry, free_finish_done, free_cancel_claimed, free_retry_later)


def free_lease_expiry(job: Job) -> None:
    from django_dbqueue.queue.leases import recover_expired

    Job.objects.filter(pk=job.pk).update(owner_date=timezone.now() - timezone.timedelta(hours=1))
    assert recover_expired(Job, "default", lease_timeout=1.0) != (0, 0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "leave",
    [
        free_done,
        free_retry,
        free_give_back,
        free_cancel,
        free_delete,
        free_lease_expiry,
        free_finish_done,
        free_cancel_claimed,
        free_retry_later,
    ],
)
def test_every_way_out_of_claimed_frees_the_slot_once(leave: Callable[[Job], None]) -> None:
    first = enqueue(jobs.noop, concurrency_key="k", max_attempts=5)
    second = enqueue(jobs.noop, concurrency_key="k", max_attempts=5)
    [running] = claim()
    assert running.pk == first.pk
    assert claim() == []

    leave(running)
    released = release_parked(Job, "default", lock=False, force=True)
    assert released == (0 if leave in RELEASE_THEMSELVES else 1)
    assert not Job.objects.filter(pk=second.pk, run_after=PARKED_UNTIL).exists()

    again = claim()
    assert len(again) == 1, "one slot, one job"
    assert claim() == []
    assert Job.objects.filter(concurrency_key="k", status=S.CLAIMED).count() == 1
    if leave not in (free_retry, free_give_back, free_lease_expiry):
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
    # On a loaded machine the first workers may run every job before the last one has
    # started: stop them once each is up, as the test's stop() expects exit code 0.
    supervisors = WorkerProcess.objects.filter(role=WorkerProcess.Role.SUPERVISOR)
    wait_until(lambda: supervisors.count() == len(workers), timeout=120)
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

    try:
        wait_until(lambda: Job.objects.filter(status=S.DONE).count() == 3, timeout=240)
        wait_until(lambda: Job.objects.get(pk=crash.pk).status == S.FAILED, timeout=120)
    except AssertionError as stuck:
        # Stuck, not slow (these bounds are minutes): say where every job and slot was.
        proc.kill()
        out, _ = proc.communicate(timeout=60)
        rows = list(Job.objects.values_list("pk", "task", "status", "attempts", "owner"))
        keys = list(ConcurrencyKey.objects.values_list("key", "parked"))
        detail = f"jobs {rows}; keys {keys}; worker output:\n{out[-4000:]}"
        raise AssertionError(detail) from stuck
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
    from django_dbqueue.queue.concurrency import prune_keys
    from django_dbqueue.queue.retention import prune_if_due

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
    from django_dbqueue.queue.concurrency import prune_keys

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
    from django_dbqueue.queue import concurrency as concurrency_module

    monkeypatch.setattr(concurrency_module, "RELEASE_KEYS_PER_CALL", 2)
    monkeypatch.setattr(concurrency_module, "_release_cursor", {})
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


def claim_statements(keys: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Statements one claim of 2 jobs per key over ``keys`` keys (limit 1) sends."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_dbqueue.queue import concurrency as concurrency_module

    for n in range(keys):
        for _ in range(2):
            enqueue(jobs.noop, concurrency_key=f"batch:{keys}:{n}")
    # The periodic release before a claim is not what is counted here; nor is whether
    # the claim statement (PostgreSQL) is skipped after a claim of only keyed rows.
    claim_statement.forget()
    monkeypatch.setattr(concurrency_module, "_last_release", {"default": time.monotonic()})
    monkeypatch.setattr(concurrency_module, "RELEASE_INTERVAL", 3600.0)
    with CaptureQueriesContext(connection) as queries:
        claimed = claim(n=2 * keys)
    assert len(claimed) == keys, "one job of each key; the other one parks"
    Job.objects.filter(status=S.CLAIMED).update(status=S.DONE)
    return len(queries.captured_queries)


@pytest.mark.django_db
def test_a_claim_over_many_keys_sends_as_many_statements_as_over_a_few(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    few = claim_statements(3, monkeypatch)
    many = claim_statements(60, monkeypatch)
    assert many == few, f"{few} statements for 3 keys, {many} for 60"
    assert few <= 12


@pytest.mark.django_db
def test_a_release_over_many_keys_sends_as_many_statements_as_over_a_few() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def release_statements(keys: int) -> int:
        for n in range(keys):
            for _ in range(3):
                enqueue(jobs.noop, concurrency_key=f"release:{keys}:{n}")
        assert len(claim(n=3 * keys)) == keys
        Job.objects.filter(status=S.CLAIMED).update(status=S.DONE, finished_at=timezone.now())
        with CaptureQueriesContext(connection) as queries:
            assert release_parked(Job, "default", lock=False, force=True) == keys
        Job.objects.filter(concurrency_key__startswith=f"release:{keys}:").delete()
        ConcurrencyKey.objects.filter(key__startswith=f"release:{keys}:").update(parked=False)
        return len(queries.captured_queries)

    few, many = release_statements(2), release_statements(40)
    assert many == few, f"{few} statements for 2 keys, {many} for 40"


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["Key", "key ", "kéy"])
def test_keys_differing_in_case_accents_or_spaces_have_limits_of_their_own(case: str) -> None:
    """Two keys, two limits, on every database: on MariaDB too, whose default collation
    took "Key" (and "key ", "kéy") for "key" until migration 0010 made the column binary."""
    enqueue(jobs.noop, concurrency_key="key")
    claim()
    other = enqueue(jobs.noop, concurrency_key=case)
    assert [j.pk for j in claim("w2")] == [other.pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.only_vendor("mysql", "postgresql")
def test_a_batch_locks_its_key_rows_in_key_order() -> None:
    """The row of each key is locked in key order, however the rows lie in the table:
    a claim waiting on one key holds the keys before it and none after it."""
    import threading

    from django.db import connection, connections, transaction

    from django_dbqueue.queue.concurrency import lock_keys

    keys = [f"order:{n:03d}" for n in range(100)]
    # Inserted backwards, so that the id order is the reverse of the key order.
    ConcurrencyKey.objects.bulk_create([ConcurrencyKey(key=key) for key in reversed(keys)])
    held, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                lock_keys(connections["default"], [keys[50]], lock=True)
                held.set()
                done.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            held.set()
        finally:
            connections.close_all()

    def batch() -> None:
        try:
            with transaction.atomic():
                lock_keys(connections["default"], list(reversed(keys)), lock=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    holder, batcher = threading.Thread(target=hold), threading.Thread(target=batch)
    holder.start()
    assert held.wait(30)
    batcher.start()
    time.sleep(1.0)  # the batch now waits on key 50
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            table = connection.ops.quote_name("dbqueue_concurrency")
            column = connection.ops.quote_name("key")
            cursor.execute(
                f"SELECT {column} FROM {table} WHERE {column} LIKE %s "  # noqa: S608
                f"ORDER BY {column} FOR UPDATE SKIP LOCKED",
                ["order:%"],
            )
            free = [row[0] for row in cursor.fetchall()]
    finally:
        done.set()
        holder.join(30)
        batcher.join(30)
    assert not errors
    assert free == keys[51:], "keys 0-49 held by the waiting batch, 50 by the holder"


WAKE = {} if CURRENT_VENDOR == "postgresql" else {"WAKEUP_REDIS_ALIAS": "redis"}


@pytest.mark.parametrize("outcome", ["done", "failed", "cancelled"])
def test_a_parked_job_starts_as_soon_as_its_keys_holder_finishes(
    outcome: str, processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    """Not at the next poll (30 s), nor at a claim's periodic release (the only worker
    is idle): the write that frees the slot releases the parked job and wakes workers."""
    holder = enqueue(jobs.noop, concurrency_key="probe:p", max_attempts=1)
    waiting = enqueue(jobs.keyed_probe, args=["p", 1])
    [held] = Job.objects.claim("elsewhere", 1)
    assert held.pk == holder.pk
    env = worker_env(POLL_INTERVAL=30, MIN_POLL_INTERVAL=30, **WAKE)
    proc = processes.run_jobs(env=env)
    wait_until(lambda: Job.objects.get(pk=waiting.pk).run_after == PARKED_UNTIL, timeout=60)
    time.sleep(1.5)  # the worker's claim came back empty: it waits for a wake-up

    began = time.monotonic()
    with override_settings(DBQUEUE={**settings.DBQUEUE, **WAKE}):  # as the worker has it
        if outcome == "done":
            assert finish_done(Job, "default", "elsewhere", [held]) == {held.pk}
        elif outcome == "failed":
            failed = finish_failed_attempt(Job, "default", "elsewhere", held, "boom", "E")
            assert failed == S.FAILED
        else:
            assert cancel_claimed(Job, "default", "elsewhere", held, "stopped")
    wait_until(lambda: Job.objects.get(pk=waiting.pk).status == S.DONE, timeout=60)
    took = time.monotonic() - began
    stop(proc)
    assert took < 10, f"the parked job ran {took:.1f} s after its slot freed"
