"""WAITING -> QUEUED or CANCELLED: a job's dependencies ended (docs/workflows.md).

:func:`ended` runs in the transaction that finished the dependencies, so a dependent
becomes runnable (or is cancelled) in the same commit as its last dependency's end.
Each dependent's row is locked before its edges are read or written: two dependencies
finishing at once in two processes take turns on it, and the second sees the first's
edge satisfied (a locking read sees the latest committed rows, not a snapshot).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import connections

from django_dbqueue.queue import announce, clock
from django_dbqueue.status import CANCELLED, DONE, FINISHED, QUEUED, WAITING

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# A dependency that no longer exists (retention or an operator deleted it before it
# ended) counts as cancelled: its dependents follow their on_dependency_failure rule.
MISSING = "missing"


def _edges() -> Any:
    return apps.get_model("django_dbqueue", "Dependency")


def lock_dependencies(model: type[Job], using: str, ids: Iterable[int]) -> dict[int, str]:
    """At enqueue, in the caller's transaction: lock the dependencies' rows (in id order)
    and return their statuses; those that have not ended are marked ``workflow`` so their
    finish releases the new dependent. A missing id is absent from the result."""
    wanted = sorted(set(ids))
    rows = model.objects.using(using).select_for_update().filter(id__in=wanted).order_by("id")
    statuses = dict(rows.values_list("id", "status"))
    pending = [job_id for job_id, status in statuses.items() if status not in FINISHED]
    if pending:
        model.objects.using(using).filter(id__in=pending, workflow=False).update(workflow=True)
    return statuses


def ended(model: type[Job], using: str, ends: Mapping[int, str]) -> dict[int, str]:
    """Jobs ``ends`` (id -> DONE, FAILED or CANCELLED) just ended, in the caller's
    transaction: satisfy, release or cancel their waiting dependents, transitively.
    Returns ``ends`` with the dependents it cancelled."""
    every = dict(ends)
    while ends:
        rows = (
            _edges()
            .objects.using(using)
            .filter(depends_on_id__in=list(ends), satisfied=False)
            .values_list("job_id", "depends_on_id")
        )
        found = [(job_id, dep, ends[dep]) for job_id, dep in rows]
        ends = resolve(model, using, found)
        every.update(ends)
    return every


def resolve(model: type[Job], using: str, found: Iterable[tuple[int, int, str]]) -> dict[int, str]:
    """Apply the ends of dependencies to their dependents: ``found`` is (dependent,
    dependency, how the dependency ended). Returns the dependents cancelled by it (id
    -> CANCELLED), whose own dependents follow."""
    per_job: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for job_id, dep, status in found:
        per_job[job_id].append((dep, status))
    cancelled: dict[int, str] = {}
    released: set[str] = set()
    for job_id in sorted(per_job):  # one lock order for every finisher: no deadlock
        outcome = _resolve_one(model, using, job_id, per_job[job_id])
        if outcome == CANCELLED:
            cancelled[job_id] = CANCELLED
        elif outcome is not None:
            released.add(outcome)
    if released:
        announce.notify(sorted(released))
    return cancelled


def _resolve_one(
    model: type[Job], using: str, job_id: int, deps: list[tuple[int, str]]
) -> str | None:
    """One dependent: CANCELLED if cancelled, its queue if released, else None."""
    jobs = model.objects.using(using)
    locked = jobs.select_for_update().filter(id=job_id).values_list("status", "queue").first()
    if locked is None or locked[0] != WAITING:
        return None  # cancelled, released or deleted meanwhile
    edges = _edges().objects.using(using).filter(job_id=job_id)
    run_anyway = dict(edges.values_list("depends_on_id", "run_on_failure"))
    notes = []
    for dep, status in deps:
        if status != DONE and not run_anyway.get(dep, False):
            reason = f"Cancelled: dependency #{dep} {_ended_how(status)}."
            jobs.filter(id=job_id, status=WAITING).update(
                status=CANCELLED, finished_at=clock.now(using), unique_key=None, last_error=reason
            )
            return CANCELLED
        if status != DONE:
            notes.append(f"dependency #{dep} {_ended_how(status)}; run anyway")
        edges.filter(depends_on_id=dep).update(satisfied=True)
    # A locking read: the latest committed edges, whoever satisfied them.
    if edges.filter(satisfied=False).select_for_update().exists():
        if notes:
            jobs.filter(id=job_id).update(last_error="; ".join(notes))
        return None
    update: dict[str, Any] = {"status": QUEUED}
    if notes:
        update["last_error"] = "; ".join(notes) + " (on_dependency_failure='run')."
    jobs.filter(id=job_id, status=WAITING).update(**update)
    return str(locked[1])


def _ended_how(status: str) -> str:
    return "was deleted" if status == MISSING else f"ended {status}"


def stuck(model: type[Job], using: str, limit: int = 500) -> list[tuple[int, int, str]]:
    """Edges of WAITING jobs whose dependency ended or is gone but were not applied (an
    end recorded outside the finish paths, or a deleted row): (dependent, dependency,
    status or MISSING). One bounded read for the sweep."""
    conn = connections[using]
    qn = conn.ops.quote_name
    job, dep = qn(model._meta.db_table), qn(_edges()._meta.db_table)
    statuses = ", ".join(["%s"] * len(FINISHED))
    sql = (
        f"SELECT d.{qn('job_id')}, d.{qn('depends_on_id')}, o.{qn('status')} "  # noqa: S608
        f"FROM {dep} d JOIN {job} w ON w.{qn('id')} = d.{qn('job_id')} "
        f"LEFT JOIN {job} o ON o.{qn('id')} = d.{qn('depends_on_id')} "
        f"WHERE d.{qn('satisfied')} = %s AND w.{qn('status')} = %s "
        f"AND (o.{qn('id')} IS NULL OR o.{qn('status')} IN ({statuses})) "
        f"ORDER BY d.{qn('job_id')} LIMIT %s"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [False, WAITING, *FINISHED, limit])
        return [(int(a), int(b), str(c or MISSING)) for a, b, c in cursor.fetchall()]


def results_of(model: type[Job], using: str, job_id: int) -> dict[int, Any]:
    """The results of job ``job_id``'s dependencies that ended DONE, by id."""
    deps = _edges().objects.using(using).filter(job_id=job_id).values_list("depends_on_id")
    rows = model.objects.using(using).filter(id__in=deps, status=DONE)
    return dict(rows.values_list("id", "result"))
