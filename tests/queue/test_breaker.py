"""The circuit breaker of optional services (queue/breaker.py), on a clock of our own."""

from __future__ import annotations

import logging
import threading

import pytest

from django_dbqueue.queue.breaker import CircuitBreaker
from tests.support import wait_until


def test_closed_until_a_failure_then_skips_until_its_cooldown() -> None:
    breaker = CircuitBreaker("svc", first_cooldown=1.0, max_cooldown=4.0)
    assert breaker.allow(0.0)
    breaker.failed(0.0, OSError("down"))
    assert not breaker.allow(0.5)
    assert breaker.allow(1.0), "one trial once the cooldown is over"
    assert not breaker.allow(1.0), "only one caller tries"
    breaker.failed(1.0, OSError("down"))
    assert not breaker.allow(2.5), "a failed trial doubles the cooldown"
    assert breaker.allow(3.0)
    breaker.failed(3.0, OSError("down"))
    breaker.allow(7.0)
    breaker.failed(7.0, OSError("down"))
    assert breaker.cooldown == 4.0, "never longer than max_cooldown"
    assert breaker.allow(11.0)
    breaker.succeeded()
    assert breaker.closed
    assert all(breaker.allow(11.0) for _ in range(3))


def test_one_warning_when_an_outage_starts_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    breaker = CircuitBreaker("svc", first_cooldown=1.0)
    caplog.set_level(logging.WARNING, "django_dbqueue.wakeup")
    for moment in range(20):
        if breaker.allow(float(moment)):
            breaker.failed(float(moment), OSError("down"))
    breaker.allow(1000.0)
    breaker.succeeded()
    breaker.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("svc unavailable (down)")
    assert messages[1].startswith("svc available again after 5 failed calls")


def test_a_probe_tries_the_service_so_no_caller_waits_on_it() -> None:
    answers: list[BaseException | None] = [OSError("still down"), None]
    probed = threading.Event()

    def probe() -> None:
        answer = answers.pop(0)
        probed.set()
        if answer is not None:
            raise answer

    breaker = CircuitBreaker("svc", probe=probe, first_cooldown=1.0)
    breaker.failed(0.0, OSError("down"))
    assert not breaker.allow(1.0), "the caller skips; the probe tries"
    wait_until(lambda: probed.is_set() and not breaker.trying)
    assert not breaker.closed and breaker.cooldown == 2.0
    probed.clear()
    assert not breaker.allow(2.0)
    assert not breaker.allow(3.0)
    wait_until(lambda: breaker.closed)
    assert answers == []
    assert breaker.allow(3.0)
