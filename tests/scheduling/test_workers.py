"""Recurring ticks, paused queues and retention with real run_jobs processes."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from django.utils import timezone

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job, ScheduleTick
from django_dbqueue.queue import pausing
from tests.support import CURRENT_VENDOR, Processes, grow_by_copying, jobs, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# MariaDB and SQLite announce through Redis, PostgreSQL through NOTIFY.
WAKE = {} if CURRENT_VENDOR == "postgresql" else {"WAKEUP_REDIS_ALIAS": "redis"}
EVERY_SECOND = {"tick": {"task": "tests.support.jobs.noop", "every": 1}}


def tick_seconds() -> list[int]:
    """The enqueued ticks, as whole seconds since the epoch, in order."""
    return [
        int(t.timestamp())
        for t in ScheduleTick.objects.order_by("tick_at").values_list("tick_at", flat=True)
    ]


def assert_each_tick_has_one_job() -> None:
    ticks = list(ScheduleTick.objects.values_list("job_id", flat=True))
    assert None not in ticks
    assert len(set(ticks)) == len(ticks)
    assert Job.objects.filter(task="tests.support.jobs.noop").count() == len(ticks)


def test_three_workers_enqueue_each_tick_once_even_when_one_is_killed(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    env = worker_env(SCHEDULE=EVERY_SECOND, HEARTBEAT_INTERVAL=1, LEASE_TIMEOUT=5)
    workers = [processes.run_jobs("-v", "0", env=env) for _ in range(3)]
    wait_until(lambda: ScheduleTick.objects.count() >= 5, timeout=60)
    workers[0].send_signal(signal.SIGKILL)
    # Past the killed worker's lease (5 s): the ticks it would have taken are taken.
    wait_until(lambda: ScheduleTick.objects.count() >= 16, timeout=60)
    for worker in workers[1:]:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(timeout=60)

    seconds = tick_seconds()
    # 16 consecutive ticks (and more): no second missing, none twice.
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    assert len(seconds) >= 16
    assert_each_tick_has_one_job()


def test_a_clock_jump_forward_and_back_enqueues_no_tick_twice(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    clock = tmp_path / "clock"
    clock.write_text("0")
    env = worker_env(SCHEDULE=EVERY_SECOND)
    env["DBQUEUE_TEST_CLOCK_FILE"] = str(clock)
    workers = [processes.run_jobs("-v", "0", env=env) for _ in range(3)]
    wait_until(lambda: ScheduleTick.objects.count() >= 5, timeout=60)
    clock.write_text("3600")  # an hour forward for every worker at once
    if CURRENT_VENDOR != "sqlite":
        # The database's clock decides (queue/clock.py): the hosts' jumps move no tick.
        wait_until(lambda: ScheduleTick.objects.count() >= 10, timeout=60)
        clock.write_text("3597")
        wait_until(lambda: ScheduleTick.objects.count() >= 15, timeout=60)
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
        seconds = tick_seconds()
        assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
        assert_each_tick_has_one_job()
        return

    # SQLite has no server clock: the one host's clock is the database's, and it jumped.
    def after_jump() -> list[int]:
        seconds = tick_seconds()
        return [s for s in seconds if s - seconds[0] > 1000]

    wait_until(lambda: len(after_jump()) >= 4, timeout=60)
    clock.write_text("3597")  # three seconds back: those ticks exist already
    wait_until(lambda: len(after_jump()) >= 8, timeout=60)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(timeout=60)

    seconds = tick_seconds()
    jump = next(i for i in range(1, len(seconds)) if seconds[i] - seconds[i - 1] > 1)
    before, after = seconds[:jump], seconds[jump:]
    # Missed ticks after the jump follow the default policy: only the latest, once.
    assert before == list(range(before[0], before[0] + len(before)))
    assert after == list(range(after[0], after[0] + len(after)))
    assert 3590 <= after[0] - before[-1] <= 3610
    assert len(after) >= 8
    assert_each_tick_has_one_job()


def test_pause_stops_claiming_within_a_poll_interval_and_resume_finishes_the_drain(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    created = enqueue_many(
        {"task": jobs.sleep, "args": [0.004], "queue": "emails"} for _ in range(2000)
    )
    env = worker_env(BATCH_SIZE=10, POLL_INTERVAL=0.5)
    proc = processes.run_jobs("--concurrency", "2", "--queue", "emails", env=env)
    done = Job.objects.filter(queue="emails", status=Job.Status.DONE)
    wait_until(lambda: done.count() >= 300, timeout=120)
    pausing.pause("emails")
    paused_at = timezone.now()
    time.sleep(2.5)
    count = done.count()
    time.sleep(1.5)
    assert done.count() == count < 2000  # nothing moves while paused
    bound = paused_at + timedelta(seconds=0.5 + 0.5)  # POLL_INTERVAL + a batch in flight
    assert not Job.objects.filter(queue="emails", started_at__gt=bound).exists()

    pausing.resume("emails")
    wait_until(lambda: done.count() == 2000, timeout=120)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in created]).values_list("status", "attempts")
    ) == {(Job.Status.DONE, 1)}


@pytest.mark.parametrize("threads", ["1", "4"])
def test_pause_reaches_busy_workers_at_once_through_the_wakeup_channel(
    processes: Processes, worker_env: Callable[..., dict[str, str]], threads: str
) -> None:
    # POLL_INTERVAL 10 s: without the announcement the drain would run on for seconds.
    created = enqueue_many(
        {"task": jobs.sleep, "args": [0.004], "queue": "emails"} for _ in range(2000)
    )
    env = worker_env(**WAKE, BATCH_SIZE=10, POLL_INTERVAL=10)
    proc = processes.run_jobs(
        "--concurrency", "2", "--threads", threads, "--queue", "emails", env=env
    )
    done = Job.objects.filter(queue="emails", status=Job.Status.DONE)
    wait_until(lambda: done.count() >= 200, timeout=120)
    with override_settings(DBQUEUE={**django_settings.DBQUEUE, **WAKE}):
        pausing.pause("emails")
    paused_at = timezone.now()
    time.sleep(1.5)
    count = done.count()
    time.sleep(1.0)
    assert done.count() == count < 2000  # nothing moves while paused
    # The documented bound (docs/scheduling.md): the jobs already claimed, at most
    # BATCH_SIZE of 4 ms here, plus the notification's trip; 1 s leaves room for load.
    bound = paused_at + timedelta(seconds=1.0)
    assert not Job.objects.filter(queue="emails", started_at__gt=bound).exists()

    # Resuming is announced too: the idle workers (10 s between polls) start at once.
    with override_settings(DBQUEUE={**django_settings.DBQUEUE, **WAKE}):
        pausing.resume("emails")
    resumed = time.monotonic()
    wait_until(lambda: done.count() > count, timeout=5, interval=0.01)
    assert time.monotonic() - resumed < 3.0
    wait_until(lambda: done.count() == 2000, timeout=120)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in created]).values_list("status", "attempts")
    ) == {(Job.Status.DONE, 1)}


def test_pruning_many_old_rows_during_a_drain_loses_no_unfinished_job(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    old = timezone.now() - timedelta(days=3)
    history = 60_000  # 30 DELETEs of the batch size: enough to interleave with the drain
    Job.objects.insert_many(
        [
            Job(task="tests.support.jobs.noop", status=Job.Status.DONE, finished_at=old)
            for _ in range(2000)
        ]
    )
    grow_by_copying(Job.objects.filter(finished_at=old), history)
    assert Job.objects.count() == history
    created = enqueue_many({"task": jobs.add, "args": [i, 1]} for i in range(2000))
    # Turns every 0.2 s, of 2,000 ids a DELETE (still short): the backlog goes in seconds.
    env = worker_env(RETENTION_INTERVAL=0.2, PRUNE_BATCH_SIZE=2000)
    log = tmp_path / "retention.log"
    env["DBQUEUE_TEST_LOG_FILE"] = str(log)
    proc = processes.run_jobs("--concurrency", "2", env=env)
    old_rows = Job.objects.filter(status=Job.Status.DONE, finished_at__lte=old)
    wait_until(lambda: not old_rows.exists(), timeout=240)
    waiting = Job.objects.filter(pk__in=[j.pk for j in created])
    wait_until(lambda: waiting.filter(status=Job.Status.DONE).count() == 2000, timeout=120)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert sorted(waiting.values_list("result", flat=True)) == sorted(i + 1 for i in range(2000))
    assert Job.objects.count() == 2000
    # Every DELETE the workers ran, as they logged it: none over the batch size, and
    # together exactly the old rows.
    batches = [
        int(line.split("removed ")[1].split()[0])
        for line in log.read_text().splitlines()
        if "one DELETE removed" in line
    ]
    assert max(batches) == 2000
    assert sum(batches) == history
    assert len(batches) >= history // 2000
