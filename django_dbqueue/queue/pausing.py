"""Paused queues: workers stop claiming from them, jobs wait, enqueue still works.

The switch is a row per queue (:class:`~django_dbqueue.models.QueueState`), so it survives
restarts and every worker on every host sees it. Workers read the paused set at most once
per ``POLL_INTERVAL`` (:class:`PauseWatcher`), which bounds how long a busy worker keeps
claiming from a queue after it was paused. With a wake-up channel (queue/announce.py) a
pause or resume is also announced on commit: every worker re-reads the paused set before
its next claim, and idle ones wake to do so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from django.db import router, transaction
from django.dispatch import Signal

from django_dbqueue import signals
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import QueueState
from django_dbqueue.queue import clock
from django_dbqueue.queue.dialects import write_transaction


def _check_queue(queue: str) -> None:
    if queue not in settings.QUEUES:
        raise InvalidJob(
            f"Unknown queue {queue!r}. Known queues: {', '.join(sorted(settings.QUEUES))}."
        )


def _set(queue: str, paused: bool, by: str) -> bool:
    """Set the switch; True when it changed."""
    _check_queue(queue)
    using = router.db_for_write(QueueState)
    # Read then write: on SQLite the transaction must take the write lock at BEGIN, or a
    # busy queue makes its upgrade fail at once with "database is locked".
    with write_transaction(using):
        state, created = (
            QueueState.objects.using(using)
            .select_for_update()
            .get_or_create(name=queue, defaults={"paused": paused, "changed_by": by})
        )
        if created:
            return paused  # no row meant "running"
        if state.paused == paused:
            return False
        state.paused, state.changed_at, state.changed_by = paused, clock.now(using), by
        state.save(using=using)
        return True


def _announce(signal: Signal, queue: str) -> None:
    using = router.db_for_write(QueueState)
    transaction.on_commit(lambda: signal.send(QueueState, queues=[queue]), using=using)


def pause(queue: str, by: str = "") -> bool:
    """Stop workers claiming from ``queue``; True if it was running. Running jobs finish."""
    changed = _set(queue, True, by)
    if changed:
        _announce(signals.queues_paused, queue)
    return changed


def resume(queue: str, by: str = "") -> bool:
    """Let workers claim from ``queue`` again; True if it was paused."""
    changed = _set(queue, False, by)
    if changed:
        _announce(signals.queues_resumed, queue)
    return changed


def paused_queues() -> set[str]:
    # The primary: a replica that lags would keep a paused queue running.
    using = router.db_for_write(QueueState)
    return set(QueueState.objects.using(using).filter(paused=True).values_list("name", flat=True))


class PauseWatcher:
    """Which of a worker's queues it may claim from, re-read every ``interval``, and at
    once when a pause or resume was announced (``active(switched=True)``)."""

    def __init__(self, queues: Sequence[str], interval: float | None = None) -> None:
        self.queues = list(queues)
        self.interval = float(settings.POLL_INTERVAL if interval is None else interval)
        self._paused: set[str] = set()
        self._read_at = float("-inf")

    def refresh(self) -> None:
        self._paused = paused_queues()
        self._read_at = time.monotonic()

    def active(self, switched: bool = False) -> list[str]:
        if switched or time.monotonic() - self._read_at >= self.interval:
            self.refresh()
        return [q for q in self.queues if q not in self._paused]

    @property
    def paused(self) -> list[str]:
        return [q for q in self.queues if q in self._paused]
