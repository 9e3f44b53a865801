"""The health check behind ``manage.py dbqueue_health``, for process managers and probes.

Live (the default): the database answers and this host's supervisor is alive (a
``WorkerProcess`` row of role supervisor on this host with a fresh heartbeat). Ready
(``ready=True``): the database answers and is migrated, whatever runs on this host. With
``max_lag``, also: no queue's oldest due job has waited longer than that.

Heartbeats are written with the host's clock (worker/rows.py), and this check runs on the
same host: it compares them with that clock, which is the one that wrote them.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, router

from django_dbqueue.conf import settings
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue import clock, counts
from django_dbqueue.queue.schema import schema_problem


@dataclass
class Report:
    """What was checked (``facts``) and one line per problem found."""

    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, **self.facts}


def default_heartbeat_age() -> float:
    """A supervisor that missed about three heartbeats in a row is taken for dead."""
    return 3 * float(settings.HEARTBEAT_INTERVAL)


def check(
    *,
    ready: bool = False,
    max_lag: float | None = None,
    max_heartbeat_age: float | None = None,
    host: str | None = None,
) -> Report:
    using = router.db_for_write(Job)
    report = Report(facts={"database": using, "mode": "ready" if ready else "live"})
    try:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        if ready:
            problem = schema_problem(using)
            if problem:
                report.problems.append(problem)
                return report
        now = clock.now(using)
        if not ready:
            _supervisor(report, using, host or socket.gethostname(), now, max_heartbeat_age)
        if max_lag is not None:
            _lag(report, using, now, max_lag)
    except DatabaseError as exc:
        report.problems.append(f"Database {using!r} does not answer: {_one_line(exc)}")
    return report


def _supervisor(
    report: Report, using: str, host: str, now: datetime, max_age: float | None
) -> None:
    limit = default_heartbeat_age() if max_age is None else max_age
    # The host name as worker/rows.py writes it: socket.gethostname().
    beats = list(
        WorkerProcess.objects.using(using)
        .filter(host=host, role=WorkerProcess.Role.SUPERVISOR)
        .values_list("heartbeat_at", flat=True)
    )
    ages = sorted((now - beat).total_seconds() for beat in beats)
    report.facts["host"] = host
    report.facts["supervisor_heartbeat_age"] = ages[0] if ages else None
    if not ages:
        report.problems.append(f"No run_jobs supervisor is registered on host {host!r}.")
    elif ages[0] > limit:
        report.problems.append(
            f"The run_jobs supervisor on host {host!r} last beat {ages[0]:.0f} s ago "
            f"(over {limit:g} s)."
        )


def _lag(report: Report, using: str, now: datetime, max_lag: float) -> None:
    queues = list(settings.QUEUES)
    oldest = counts.oldest_runnable(Job, using, queues, now)
    lags = {queue: max(0.0, (now - at).total_seconds()) for queue, (_, at) in oldest.items()}
    report.facts["lag_seconds"] = {queue: lags.get(queue, 0.0) for queue in queues}
    for queue in queues:
        if lags.get(queue, 0.0) > max_lag:
            job_id = oldest[queue][0]
            report.problems.append(
                f"Queue {queue!r}: its oldest due job ({job_id}) has waited "
                f"{lags[queue]:.0f} s (over {max_lag:g} s)."
            )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
