"""RATE_LIMITS: at most N starts per period across every worker, enforced at claim."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest
from django.core import checks
from django.test import override_settings

from django_dbqueue import enqueue_many
from django_dbqueue.checks import check_rate_limits
from django_dbqueue.models import Job, RateSlot
from tests.support import Processes, jobs

LIMIT, PERIOD, TOTAL = 10, 1.0, 300


def most_in_a_window(starts: list[float], period: float) -> int:
    """The most starts in any window [t, t + period) (a window starting at a start
    holds at least as many as any other)."""
    starts = sorted(starts)
    most = j = 0
    for i, start in enumerate(starts):
        j = max(j, i)
        while j < len(starts) and starts[j] < start + period:
            j += 1
        most = max(most, j - i)
    return most


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_three_supervisors_start_at_most_ten_jobs_in_any_second(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many([{"task": jobs.noop, "queue": "reports"} for _ in range(TOTAL)])
    env = worker_env(
        RATE_LIMITS={"reports": {"limit": LIMIT, "period": PERIOD}},
        POLL_INTERVAL=0.05,
        MIN_POLL_INTERVAL=0.02,
    )
    began = time.monotonic()
    procs = [
        processes.run_jobs("--queue", "reports", "--concurrency", "2", env=env) for _ in range(3)
    ]
    output: list[str] = []
    readers = [
        threading.Thread(target=lambda p=p: output.extend(p.stdout or []), daemon=True)
        for p in procs
    ]
    for reader in readers:
        reader.start()
    done = Job.objects.filter(status=Job.Status.DONE)
    while done.count() < TOTAL:
        assert time.monotonic() - began < 240, f"{done.count()} done; " + "".join(output)[-2000:]
        time.sleep(0.5)
    took = time.monotonic() - began
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, "".join(output)[-3000:]
    starts = [j.started_at.timestamp() for j in done.only("started_at")]
    span = max(starts) - min(starts)
    most = most_in_a_window(starts, PERIOD)
    print(f"rate limit: {TOTAL} jobs in {took:.1f} s, starts over {span:.1f} s, peak {most}/s")
    assert most <= LIMIT
    assert most == LIMIT, "the limit was reached"
    assert span >= (TOTAL / LIMIT - 1) * PERIOD  # implied by the above; said plainly
    assert RateSlot.objects.filter(key="reports").count() == LIMIT


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "must be a dict"),
        ({"reports": {"limit": 0, "period": 1}}, "whole number"),
        ({"reports": {"limit": True, "period": 1}}, "whole number"),
        ({"reports": {"limit": 5, "period": 0}}, "0.01 to 86400"),
        ({"reports": {"limit": 5}}, "must be"),
        ({"reports": {"limit": 5, "period": 1, "burst": 2}}, "must be"),
        ({"nowhere": {"limit": 5, "period": 1}}, "not in DBQUEUE"),
        ({"key:": {"limit": 5, "period": 1}}, "names no concurrency key"),
        ({"key:api": {"limit": 0, "period": 1}}, "whole number"),
        (
            {"key:Api": {"limit": 5, "period": 1}, "key:api": {"limit": 5, "period": 1}},
            "differ only in case",
        ),
    ],
)
def test_bad_rate_limits_are_check_errors(value: object, message: str) -> None:
    from django.conf import settings

    with override_settings(DBQUEUE={**settings.DBQUEUE, "RATE_LIMITS": value}):
        errors = check_rate_limits()
    assert len(errors) == 1
    assert isinstance(errors[0], checks.Error)
    assert message in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_claims_over_the_limit_take_nothing_and_unused_slots_are_freed() -> None:
    from django.conf import settings

    enqueue_many([{"task": jobs.noop, "queue": "reports"} for _ in range(5)])
    limits = {"reports": {"limit": 3, "period": 60}}
    with override_settings(DBQUEUE={**settings.DBQUEUE, "RATE_LIMITS": limits}):
        # One job a claim (it starts at once), as long as slots are free.
        assert [len(Job.objects.claim(f"w{n}", 10, ["reports"])) for n in range(4)] == [
            1,
            1,
            1,
            0,
        ]
        assert Job.objects.filter(status=Job.Status.QUEUED).count() == 2  # never claimed
    Job.objects.filter(status=Job.Status.QUEUED).delete()
    RateSlot.objects.update(used_at=RateSlot.objects.first().used_at.replace(year=2001))
    with override_settings(DBQUEUE={**settings.DBQUEUE, "RATE_LIMITS": limits}):
        assert len(Job.objects.claim("w3", 10, ["reports"])) == 0  # no jobs: slots freed
    # The one slot that claim took was given back; the others were not touched.
    assert RateSlot.objects.filter(used_at__year=2000).count() == 1
    assert RateSlot.objects.filter(used_at__year=2001).count() == 2


def test_a_concurrency_key_limit_names_no_queue() -> None:
    from django.conf import settings

    limits = {"key:api.example.com": {"limit": 5, "period": 1}}
    with override_settings(DBQUEUE={**settings.DBQUEUE, "RATE_LIMITS": limits}):
        assert check_rate_limits() == []


KEYED = {"task": jobs.noop, "concurrency_key": "partner", "concurrency_limit": 100}


@pytest.mark.django_db(transaction=True)
def test_keyed_jobs_over_their_keys_limit_are_parked_not_claimed_then_released() -> None:
    from django.conf import settings
    from django.db import connection

    from django_dbqueue.queue.concurrency import PARKED_UNTIL, release_parked

    lock = connection.vendor != "sqlite"  # locking reads
    enqueue_many([KEYED] * 5 + [{"task": jobs.noop}] * 2)
    limits = {"key:partner": {"limit": 2, "period": 60}}
    with override_settings(DBQUEUE={**settings.DBQUEUE, "RATE_LIMITS": limits}):
        took = [Job.objects.claim(f"w{n}", 10, ["default"]) for n in range(3)]
        keyed = [[j for j in claimed if j.concurrency_key] for claimed in took]
        # One keyed job a claim while slots are free, none after; other jobs are not held.
        assert [len(k) for k in keyed] == [1, 1, 0]
        assert sum(len(claimed) for claimed in took) == 4
        waiting = Job.objects.filter(concurrency_key="partner", status=Job.Status.QUEUED)
        assert waiting.count() == 3
        assert set(waiting.values_list("attempts", flat=True)) == {0}  # never claimed
        assert waiting.filter(run_after=PARKED_UNTIL).count() == 3  # out of the claim index
        assert release_parked(Job, "default", lock, force=True) == 0  # no free slot
        slots = RateSlot.objects.filter(key="key:partner")
        assert slots.count() == 2
        slots.update(used_at=slots.first().used_at.replace(year=2001))  # the period passed
        assert release_parked(Job, "default", lock, force=True) == 2  # as many as may start
        assert len(Job.objects.claim("w9", 10, ["default"])) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_two_supervisors_start_at_most_five_jobs_of_a_key_in_any_second(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    keyed_total, limit = 60, 5
    enqueue_many([KEYED] * keyed_total + [{"task": jobs.noop}] * 40)
    env = worker_env(
        RATE_LIMITS={"key:partner": {"limit": limit, "period": PERIOD}},
        POLL_INTERVAL=0.05,
        MIN_POLL_INTERVAL=0.02,
    )
    began = time.monotonic()
    procs = [processes.run_jobs("--concurrency", "2", env=env) for _ in range(2)]
    output: list[str] = []
    for proc in procs:
        threading.Thread(target=lambda p=proc: output.extend(p.stdout or []), daemon=True).start()
    done = Job.objects.filter(status=Job.Status.DONE)
    while done.count() < keyed_total + 40:
        assert time.monotonic() - began < 240, f"{done.count()} done; " + "".join(output)[-2000:]
        time.sleep(0.5)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, "".join(output)[-3000:]
    keyed = done.filter(concurrency_key="partner")
    starts = [j.started_at.timestamp() for j in keyed.only("started_at")]
    most = most_in_a_window(starts, PERIOD)
    span = max(starts) - min(starts)
    print(f"key rate limit: {keyed_total} keyed jobs, starts over {span:.1f} s, peak {most}/s")
    assert len(starts) == keyed_total
    assert most <= limit
    assert most == limit, "the limit was reached"
    assert set(done.values_list("attempts", flat=True)) == {1}  # each claimed once
