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


def settle(
    model: type[Job],
    using: str,
    ends: Mapping[int, str],
    members: list[tuple[int, int]] | None = None,
) -> None:
    """Jobs ``ends`` (id -> DONE, FAILED or CANCELLED) just ended, in the caller's
    transaction: their dependents follow and batch members are counted; their batches
    are looked at once the transaction commits. ``members``: (job id, batch id) of the
    members of ``ends`` whose end-writing UPDATE already set ``batch_counted`` (the
    caller read them under its lock); None: find them here."""
    if not ends:
        return
    every = dependents.ended(model, using, ends)
    if members is None:
        touched = batches.count(model, using, every)
    else:
        cascaded = {job_id: status for job_id, status in every.items() if job_id not in ends}
        touched = batches.add_counts(using, members, ends) | batches.count(model, using, cascaded)
    batches.after_commit(using, touched)
