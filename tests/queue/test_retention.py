"""Retention: what is old enough goes, in short DELETEs by primary key; nothing else does."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_dbqueue.models import Duty, Job
from django_dbqueue.queue import retention
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)
TASK = f"{jobs.__name__}.add"


def make(status: str, age: timedelta, count: int = 1) -> None:
    finished = timezone.now() - age if status in Job.FINISHED else None
    Job.objects.bulk_create(
        Job(task=TASK, args=[i], status=status, finished_at=finished) for i in range(count)
    )


def counts() -> dict[str, int]:
    return {s: Job.objects.filter(status=s).count() for s in Job.Status.values}


def test_default_policy_keeps_done_a_day_failed_a_month_cancelled_a_week() -> None:
    assert retention.retention_policy() == {
        "done": timedelta(days=1),
        "failed": timedelta(days=30),
        "cancelled": timedelta(days=7),
    }


def test_policy_takes_seconds_timedeltas_and_none(settings: object) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "RETENTION": {"done": 60, "failed": None}}  # type: ignore[attr-defined]
    policy = retention.retention_policy()
    assert policy["done"] == timedelta(seconds=60)
    assert policy["failed"] is None
    assert policy["cancelled"] == timedelta(days=7)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"finished": 60}, "unknown key"),
        ({"done": "7d"}, "must be seconds"),
        ({"done": float("nan")}, "between 0 and 100 years"),
        ({"done": -1}, "between 0 and 100 years"),
        ([("done", 1)], "must be a dict"),
    ],
)
def test_bad_policy_is_a_clear_error(settings: object, value: object, message: str) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "RETENTION": value}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=message):
        retention.retention_policy()


def test_prune_deletes_only_old_finished_rows_in_batches_by_primary_key() -> None:
    make("done", timedelta(days=2), 25)
    make("done", timedelta(hours=1), 3)
    make("failed", timedelta(days=31), 4)
    make("failed", timedelta(days=2), 2)
    make("queued", timedelta(0), 5)
    make("claimed", timedelta(0), 1)
    policy = retention.retention_policy()

    with CaptureQueriesContext(connection) as queries:
        deleted, complete = retention.prune(retention.cutoffs(policy, timezone.now()), 10)

    assert (deleted, complete) == (29, True)
    assert counts() == {
        "queued": 5,
        "claimed": 1,
        "done": 3,
        "failed": 2,
        "cancelled": 0,
        "waiting": 0,
    }
    deletes = [
        q["sql"]
        for q in queries.captured_queries
        # (each batch also forgets its jobs' dependency rows: docs/workflows.md)
        if q["sql"].startswith("DELETE") and "dbqueue_dependency" not in q["sql"].split("WHERE")[0]
    ]
    assert len(deletes) == 4  # done: 10 + 10 + 5, failed: 4
    for sql in deletes:
        ids = re.search(r"IN \(([^)]*)\)", sql)
        assert ids is not None and len(ids[1].split(",")) <= 10


def test_prune_stops_at_its_time_budget_and_says_it_is_not_done() -> None:
    make("done", timedelta(days=2), 30)
    deleted, complete = retention.prune(
        retention.cutoffs(retention.retention_policy(), timezone.now()), 10, max_seconds=0
    )
    assert (deleted, complete) == (0, False)
    assert counts()["done"] == 30


def test_a_workers_turn_pauses_after_each_delete_in_proportion_to_it(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.DBQUEUE = {"PRUNE_BATCH_SIZE": 10}
    make("done", timedelta(days=2), 25)
    pauses: list[float] = []
    monkeypatch.setattr(retention.time, "sleep", pauses.append)
    # A budget no loaded machine exhausts (the default 0.5 s ended a CI run's turn after
    # the first batch): this is about the pauses, not the budget.
    assert retention.prune_if_due(max_seconds=60) == 25
    # After the two full batches (10 + 10), none after the last (5): nothing is left.
    assert len(pauses) == 2
    assert all(0 < pause < 5 for pause in pauses)


def test_only_one_caller_per_interval_gets_the_duty() -> None:
    now = timezone.now()
    assert retention.claim_duty("prune", 300, now) is True
    assert retention.claim_duty("prune", 300, now) is False
    assert retention.claim_duty("prune", 300, now + timedelta(seconds=299)) is False
    assert retention.claim_duty("prune", 300, now + timedelta(seconds=300)) is True


def test_prune_if_due_runs_once_per_interval_and_records_its_result() -> None:
    make("done", timedelta(days=2), 3)
    assert retention.prune_if_due() == 3
    assert retention.prune_if_due() is None
    assert Duty.objects.get(name="prune").last_result == "deleted 3"


def test_unfinished_backlog_brings_the_duty_back_soon(settings: object) -> None:
    make("done", timedelta(days=2), 3)
    before = timezone.now()
    assert retention.prune_if_due(max_seconds=0) == 0
    due = Duty.objects.get(name="prune").due_at
    assert due - before < timedelta(seconds=retention.BACKLOG_RETRY + 1)


def command(*args: str) -> str:
    out = StringIO()
    call_command("prune_jobs", *args, stdout=out)
    return out.getvalue()


def test_prune_jobs_dry_run_counts_and_deletes_nothing() -> None:
    make("done", timedelta(days=2), 4)
    make("failed", timedelta(days=40), 1)
    out = command("--dry-run")
    assert re.search(r"^done: would delete 4 job\(s\) finished before ", out, re.M)
    assert re.search(r"^failed: would delete 1 job\(s\)", out, re.M)
    assert re.search(r"^cancelled: would delete 0 job\(s\)", out, re.M)
    assert counts()["done"] == 4


def test_prune_jobs_with_older_than_and_status_reports_progress() -> None:
    make("done", timedelta(hours=3), 7)
    make("failed", timedelta(hours=3), 2)
    out = command("--older-than", "2h", "--status", "done", "--batch-size", "3")
    assert out.splitlines() == [
        "done: deleted 3 so far",
        "done: deleted 6 so far",
        "done: deleted 7 so far",
        "Deleted 7 finished job(s).",
    ]
    assert counts()["failed"] == 2


def test_prune_jobs_refuses_a_bad_duration_and_a_bad_policy(settings: object) -> None:
    with pytest.raises(CommandError, match="expected a duration like"):
        command("--older-than", "soon")
    settings.DBQUEUE = {**settings.DBQUEUE, "RETENTION": {"done": "7d"}}  # type: ignore[attr-defined]
    with pytest.raises(CommandError, match="must be seconds"):
        command()
