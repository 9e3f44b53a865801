"""How a worker waits out database errors: conflicts quietly, an outage said once."""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError

from django_dbqueue import signals
from django_dbqueue.queue import conflicts
from django_dbqueue.worker.connections import MAX_BACKOFF, DatabaseWaits, retry_transient

DEADLOCK = OperationalError(1213, "Deadlock found when trying to get lock; try restarting")
GONE = OperationalError(2013, "Lost connection to server during query")


def test_a_certification_conflict_is_counted_at_debug_and_retried_soon(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def receiver(sender: object, where: str, **kwargs: object) -> None:
        seen.append(where)

    signals.conflict_retried.connect(receiver)
    before = conflicts.COUNTS.get("claim", 0)
    waits = DatabaseWaits(
        "Worker w claiming", logging.getLogger("django_dbqueue.worker"), where="claim"
    )
    try:
        with caplog.at_level(logging.DEBUG, logger="django_dbqueue"):
            pauses = [waits.failed(DEADLOCK) for _ in range(20)]
    finally:
        signals.conflict_retried.disconnect(receiver)
    assert all(0 < p <= conflicts.MAX_PAUSE for p in pauses)
    assert conflicts.COUNTS["claim"] == before + 20
    assert seen == ["claim"] * 20
    assert [r.levelname for r in caplog.records] == ["DEBUG"] * 20
    assert all("Worker w claiming" in r.getMessage() for r in caplog.records)


def test_an_outage_is_said_once_with_the_address_and_backs_off_capped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits = DatabaseWaits("Supervisor", logging.getLogger("django_dbqueue.worker"))
    with caplog.at_level(logging.DEBUG, logger="django_dbqueue"):
        pauses = [waits.failed(GONE) for _ in range(30)]
        waits.succeeded()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert "Lost connection" in warnings[0] and "waiting for" in warnings[0]
    assert "answers again" in warnings[1]
    assert pauses[-1] <= MAX_BACKOFF and pauses[-1] >= MAX_BACKOFF * 0.75
    assert pauses[0] < pauses[5], "longer each time"


def test_retry_transient_retries_conflicts_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []

    def write() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise DEADLOCK
        return "written"

    with caplog.at_level(logging.DEBUG, logger="django_dbqueue"):
        assert retry_transient(write, logging.getLogger("django_dbqueue.worker"), "w") == "written"
    assert len(calls) == 3
    assert [r.levelname for r in caplog.records] == ["DEBUG", "DEBUG"]


def test_retry_quietly_gives_up_with_the_raw_error_after_its_attempts() -> None:
    calls = []

    def write() -> None:
        calls.append(1)
        raise DEADLOCK

    with pytest.raises(OperationalError):
        conflicts.retry_quietly("test", write, attempts=3)
    assert len(calls) == 3


def test_retry_quietly_does_not_retry_other_errors() -> None:
    calls = []

    def write() -> None:
        calls.append(1)
        raise GONE

    with pytest.raises(OperationalError):
        conflicts.retry_quietly("test", write)
    assert len(calls) == 1
