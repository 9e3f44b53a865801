"""Operator actions go through deadlocks and lock wait timeouts (issue #25, item 5).

A deadlock (MySQL 1213) or a lock wait timeout (1205) inside requeue, cancel, run now or
delete is retried a bounded number of times (each retry counted and said at DEBUG, never
as a warning) and then raised as ``ActionConflict``, never as the driver's error; inside
a caller's transaction the raw error is raised at once (the database rolled the caller's
work back: only the caller can redo it).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator

import pytest
from django.db import OperationalError, transaction

from django_dbqueue import enqueue_many
from django_dbqueue.exceptions import ActionConflict
from django_dbqueue.models import Job
from django_dbqueue.queue.conflicts import ATTEMPTS, COUNTS, retry_conflicts
from tests.support import Processes, jobs, wait_until

S = Job.Status


@pytest.fixture
def retries(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Everything the actions' own logger says, DEBUG included (whatever an earlier test
    did to propagation)."""
    actions = logging.getLogger("django_dbqueue.actions")
    actions.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, "django_dbqueue.actions")
    yield
    actions.removeHandler(caplog.handler)


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    # A record that also propagated to the root logger reached the handler twice.
    records = {
        id(r): r
        for r in caplog.records
        if r.name == "django_dbqueue.actions" and r.levelno == level
    }
    return [r.getMessage() for r in records.values()]


def conflicts_then(n: int, value: int = 7) -> tuple[Callable[[], int], list[int]]:
    calls: list[int] = []

    def write() -> int:
        calls.append(1)
        if len(calls) <= n:
            raise OperationalError(1213, "Deadlock found when trying to get lock")
        return value

    return write, calls


@pytest.mark.django_db(transaction=True)
def test_a_conflict_is_retried_then_reported_as_the_libraries_error(
    caplog: pytest.LogCaptureFixture, retries: None
) -> None:
    write, calls = conflicts_then(2)
    before = COUNTS.get("cancel", 0)
    assert retry_conflicts("default", "cancel", write) == 7
    assert len(calls) == 3
    # Quietly: counted, said at DEBUG, never a warning (routine on a Galera cluster).
    assert COUNTS["cancel"] - before == 2
    assert len([m for m in said(caplog, logging.DEBUG) if "retrying" in m]) == 2
    assert said(caplog, logging.WARNING) == []

    write, calls = conflicts_then(1000)
    with pytest.raises(ActionConflict, match="cancel: still conflicting") as caught:
        retry_conflicts("default", "cancel", write)
    assert len(calls) == ATTEMPTS
    assert isinstance(caught.value.__cause__, OperationalError)


@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_the_raw_error_is_raised_at_once() -> None:
    write, calls = conflicts_then(1)
    with pytest.raises(OperationalError), transaction.atomic():
        retry_conflicts("default", "cancel", write)
    assert len(calls) == 1


@pytest.mark.django_db(transaction=True)
def test_other_errors_are_not_retried() -> None:
    calls = []

    def write() -> None:
        calls.append(1)
        raise OperationalError(2006, "MySQL server has gone away")

    with pytest.raises(OperationalError):
        retry_conflicts("default", "cancel", write)
    assert len(calls) == 1


@pytest.mark.only_vendor("mysql")
@pytest.mark.django_db(transaction=True)
def test_operator_actions_during_real_drains_never_raise_the_drivers_error(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many([{"task": jobs.record, "args": [f"k{n}"]} for n in range(600)])
    ids = list(Job.objects.values_list("pk", flat=True))
    for _ in range(2):
        processes.run_jobs("--concurrency", "2", env=worker_env(POLL_INTERVAL=0.05))
    rng = random.Random(25)
    unfinished = Job.objects.filter(status__in=[S.QUEUED, S.CLAIMED])
    # Each round requeues what it cancelled and what the drains finished, so the drains
    # always have work while the actions run (a loop "until drained" never ends).
    for _ in range(40):
        chunk = Job.objects.filter(pk__in=rng.sample(ids, 50))
        chunk.cancel()
        chunk.requeue()
        chunk.run_now()
    wait_until(lambda: not unfinished.exists(), timeout=120)
    assert Job.objects.count() == 600
    assert set(Job.objects.values_list("status", flat=True)) <= {S.DONE, S.CANCELLED}
