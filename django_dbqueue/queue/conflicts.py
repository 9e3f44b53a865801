"""Operator actions retried through deadlocks and lock wait timeouts, a bounded number of times.

A requeue or a cancel over many rows takes row locks in one order while workers, which
claim and finish the same rows, take them in another: InnoDB then rolls one side back
(1213) or lets a lock wait time out (1205). That says nothing about the action, which
passes when tried again. So each statement (or short transaction) of an action runs up to
:data:`ATTEMPTS` times, with a short jittered pause, each conflict counted and logged at
DEBUG (:func:`note_conflict`, as the worker's are: on a Galera cluster an operator's
requeue racing workers on other nodes loses certification as a matter of course), and
what still fails becomes :class:`~django_dbqueue.exceptions.ActionConflict`, never the
raw driver error.

Never inside a caller's transaction: the database rolled the caller's work back with the
deadlock, and only the caller can redo it. There the raw ``OperationalError`` is raised,
as ``transaction.atomic()`` users expect.

On a Galera cluster a transaction that lost certification to another node's write fails
with the same 1213. The worker and the locks meet those as a matter of course: they
report each one with :func:`note_conflict` (a DEBUG line, :data:`COUNTS`, and the
``conflict_retried`` signal the metrics count), not as a warning, and
:func:`retry_quietly` retries a statement of their own with the same jittered pause.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

from django_dbqueue import signals
from django_dbqueue.exceptions import ActionConflict
from django_dbqueue.queue.dialects import is_lock_conflict

logger = logging.getLogger("django_dbqueue.actions")

T = TypeVar("T")

# An operator's action (retry_conflicts) gets about 10 s of tries in all: on a Galera
# cluster a cancel of 60 rows that workers on two other nodes keep claiming and finishing
# lost certification 12 times in a row (about 4 s of tries) in a loaded CI run of
# tests/galera, where 5 in a row had been the most seen before.
ATTEMPTS = 20
FIRST_PAUSE = 0.02  # seconds, doubled after each conflict, jittered
MAX_PAUSE = 1.0  # seconds: the longest pause between two tries
QUIET_ATTEMPTS = 12  # retry_quietly: about 4 s of tries in all before the error goes up

#: Conflicts retried in this process, by where they happened (``note_conflict``).
COUNTS: dict[str, int] = {}


def conflict_pause(attempt: int) -> float:
    """The pause after conflict number ``attempt`` (1, 2, ...): doubling, capped, jittered
    (writers that collided once must not collide again in step)."""
    return float(random.uniform(0.5, 1.0) * min(MAX_PAUSE, FIRST_PAUSE * 2 ** min(attempt - 1, 10)))


def note_conflict(where: str, exc: BaseException, who: str | None = None) -> None:
    """Count one conflict that will be retried (a deadlock, a lock wait timeout, a lost
    Galera certification) under ``where`` (a few fixed words: "claim", "record", ...),
    log it at DEBUG (as ``who``'s) and send ``signals.conflict_retried``."""
    COUNTS[where] = COUNTS.get(where, 0) + 1
    logger.debug("%s: conflict with another writer (%s); retrying", who or where, exc)
    signals.conflict_retried.send(None, where=where)


def retry_quietly(where: str, write: Callable[[], T], attempts: int = QUIET_ATTEMPTS) -> T:
    """Run ``write`` (one autocommit statement or short transaction of the app's own, never
    inside a caller's transaction) again after each conflict, up to ``attempts`` times;
    the last conflict's error goes up."""
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except DatabaseError as exc:
            if not is_lock_conflict(exc) or attempt == attempts:
                raise
            note_conflict(where, exc)
            time.sleep(conflict_pause(attempt))
    raise AssertionError("unreachable")  # the loop returns or raises


def retry_conflicts(using: str, what: str, write: Callable[[], T]) -> T:
    """Run ``write`` (one statement, or one transaction, on database ``using``), again
    after a lock conflict, at most :data:`ATTEMPTS` times in all."""
    if connections[using].in_atomic_block:
        return write()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return write()
        except DatabaseError as exc:
            if not is_lock_conflict(exc):
                raise
            if attempt == ATTEMPTS:
                raise ActionConflict(
                    f"{what}: still conflicting with other writers after {ATTEMPTS} "
                    f"attempts ({exc}); nothing of the last attempt was kept, run it again."
                ) from exc
            note_conflict(what, exc)
            time.sleep(conflict_pause(attempt))
    raise AssertionError("unreachable")  # the loop returns or raises
