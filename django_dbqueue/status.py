"""The states a job moves through, defined once for the model, the queue's SQL and the admin."""

from __future__ import annotations

from django.db import models


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    CLAIMED = "claimed", "Claimed"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    # Enqueued with dependencies that have not all finished (docs/workflows.md): not
    # claimable; it becomes QUEUED in the transaction of its last dependency's finish.
    WAITING = "waiting", "Waiting"


# Plain strings for hand-written SQL parameters (drivers get a str, not an enum member).
QUEUED: str = JobStatus.QUEUED.value
CLAIMED: str = JobStatus.CLAIMED.value
DONE: str = JobStatus.DONE.value
FAILED: str = JobStatus.FAILED.value
CANCELLED: str = JobStatus.CANCELLED.value
WAITING: str = JobStatus.WAITING.value
FINISHED: tuple[str, ...] = (DONE, FAILED, CANCELLED)
