"""enqueue(depends_on=...): the new job's state from its dependencies', and its edges.

Runs in the enqueuing transaction: the dependencies' rows are locked (in id order)
while the job and its edges are written, so a dependency cannot end between the read
of its state and the edge that its end must find (docs/workflows.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.utils import timezone

from django_dbqueue import bounds
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Dependency, Job
from django_dbqueue.queue.dependents import lock_dependencies
from django_dbqueue.status import CANCELLED, DONE, FAILED, QUEUED, WAITING

# Where build_job() leaves a job's checked dependencies for save_job() (not a field).
DEPENDS = "_dbqueue_depends_on"


class Wanted(NamedTuple):
    """A job's checked ``depends_on`` ids and ``on_dependency_failure`` rule."""

    ids: list[int]
    on_failure: str


def prepare(job: Job, using: str, wanted: Wanted) -> list[tuple[int, bool]]:
    """Lock the dependencies, set the job's status from theirs (WAITING, QUEUED, or
    CANCELLED when one already failed and the rule is "cancel"); return its edges
    (dependency id, satisfied). A missing id raises InvalidJob (nothing written)."""
    statuses = lock_dependencies(Job, using, wanted.ids)
    missing = sorted(set(wanted.ids) - statuses.keys())
    if missing:
        raise InvalidJob(f"depends_on: no job with id {', '.join(map(str, missing))}.")
    run = wanted.on_failure == "run"
    failed = [dep for dep, status in statuses.items() if status in (FAILED, CANCELLED)]
    edges = [(dep, status == DONE or (run and dep in failed)) for dep, status in statuses.items()]
    if failed and not run:
        job.status, job.finished_at, job.unique_key = CANCELLED, timezone.now(), None
        job.last_error = f"Cancelled: dependency #{failed[0]} ended {statuses[failed[0]]}."
    elif all(satisfied for _, satisfied in edges):
        job.status = QUEUED
        if failed:
            job.last_error = (
                f"Dependencies {failed} failed; run anyway (on_dependency_failure='run')."
            )
    else:
        job.status = WAITING
    return edges


def link(using: str, job_id: int, edges: list[tuple[int, bool]], wanted: Wanted) -> None:
    """The job's dependency rows (one multi-row INSERT)."""
    run = wanted.on_failure == "run"
    Dependency.objects.using(using).bulk_create(
        [
            Dependency(job_id=job_id, depends_on_id=dep, satisfied=satisfied, run_on_failure=run)
            for dep, satisfied in edges
        ]
    )


def wanted_of(given: dict[str, Any]) -> Wanted | None:
    """The checked dependency options of an enqueue() call (None: no dependencies).
    Raises InvalidJob."""
    rule = given.get("on_dependency_failure")
    rule = "cancel" if rule is None else bounds.check_on_dependency_failure(rule)
    depends_on = given.get("depends_on")
    if depends_on is None:
        return None
    ids = bounds.check_depends_on(depends_on)
    return Wanted(ids, rule) if ids else None
