"""Operator actions retried through deadlocks and lock wait timeouts, a bounded number of times.

A requeue or a cancel over many rows takes row locks in one order while workers, which
claim and finish the same rows, take them in another: InnoDB then rolls one side back
(1213) or lets a lock wait time out (1205). That says nothing about the action, which
passes when tried again. So each statement (or short transaction) of an action runs up to
:data:`ATTEMPTS` times, with a short jittered pause, and what still fails becomes
:class:`~django_dbqueue.exceptions.ActionConflict`, never the raw driver error.

Never inside a caller's transaction: the database rolled the caller's work back with the
deadlock, and only the caller can redo it. There the raw ``OperationalError`` is raised,
as ``transaction.atomic()`` users expect.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

from django_dbqueue.exceptions import ActionConflict
from django_dbqueue.queue.dialects import is_lock_conflict

logger = logging.getLogger("django_dbqueue.actions")

T = TypeVar("T")

ATTEMPTS = 5
FIRST_PAUSE = 0.02  # seconds, doubled after each conflict, jittered


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
            pause = random.uniform(0.5, 1.0) * FIRST_PAUSE * 2 ** (attempt - 1)
            logger.warning("%s: %s; retrying in %.3f s", what, exc, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")  # the loop returns or raises
