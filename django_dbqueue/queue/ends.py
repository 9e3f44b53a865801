"""What a job's end moves besides its own row (docs/workflows.md): its waiting
dependents (released or cancelled, transitively) and its batch's counts. Called by
every way a job ends (finish, failure, cancellation, lease recovery, operator cancel),
in the transaction that records the end."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from django_dbqueue.queue import batches, dependents

if TYPE_CHECKING:
    from django_dbqueue.models import Job


def settle(model: type[Job], using: str, ends: Mapping[int, str]) -> None:
    """Jobs ``ends`` (id -> DONE, FAILED or CANCELLED) just ended, in the caller's
    transaction: their dependents follow and batch members are counted; their batches
    are looked at once the transaction commits."""
    if not ends:
        return
    every = dependents.ended(model, using, ends)
    batches.after_commit(using, batches.count(model, using, every))
