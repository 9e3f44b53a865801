"""The health check behind ``manage.py dbqueue_health``, for process managers and probes.

Live (the default): the database answers and this host's supervisor is alive (a
``WorkerProcess`` row of role supervisor on this host with a fresh heartbeat). Ready
(``ready=True``): the database answers and is migrated, whatever runs on this host. With
``max_lag``, also: no queue's oldest due job has waited longer than that.

Always, on MySQL/MariaDB and PostgreSQL: the connections every live worker process of
every host may open (``WorkerProcess`` rows with a fresh heartbeat, each counted as
run_jobs budgets it, worker/connections.py) against the server's ``max_connections``:
above 80% it is a warning (printed, exit status unchanged: a probe must not restart
workers for it), since the app's own processes need connections too.

Heartbeats are written with the host's clock (worker/rows.py), and this check runs on the
same host: it compares them with that clock, which is the one that wrote them.
"""

from __future__ import annotations

import socket
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, router

from django_dbqueue.conf import settings
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue import clock, counts
from django_dbqueue.queue.schema import schema_problem
from django_dbqueue.worker.connections import (
    CONNECTIONS_WARNING,
    child_connections,
    listens,
    server_max_connections,
    supervisor_connections,
)
from django_dbqueue.worker.handout import hands_out


@dataclass
class Report:
    """What was checked (``facts``), one line per problem found, and warnings (which
    leave it ok)."""

    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "warnings": self.warnings, **self.facts}


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
        _connections(report, using, now, max_heartbeat_age)
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


def _connections(report: Report, using: str, now: datetime, max_age: float | None) -> None:
    """Warn when the live workers of all hosts may take over 80% of max_connections."""
    server_max = server_max_connections(using)
    if not server_max:
        return
    fresh = now - timedelta(seconds=default_heartbeat_age() if max_age is None else max_age)
    listen = listens(using)
    hosts: dict[str, int] = {}
    live = WorkerProcess.objects.using(using).filter(heartbeat_at__gte=fresh)
    rows = list(live.values_list("name", "host", "role", "supervisor"))
    child = WorkerProcess.Role.CHILD
    children = Counter(supervisor for _, _, role, supervisor in rows if role == child)
    for name, host, role, _ in rows:
        # A child: its own (it hears its supervisor's LISTEN: worker/relay.py). A
        # supervisor (or an unsupervised worker): its own, the LISTEN one, and its
        # claimer's when it claims for its children (worker/handout.py).
        if role == child:
            used = child_connections()
        else:
            used = supervisor_connections(listen, hands_out(children[name]))
        hosts[host] = hosts.get(host, 0) + used
    total = sum(hosts.values())
    report.facts["connections"] = {"workers": total, "hosts": hosts, "max_connections": server_max}
    if total > CONNECTIONS_WARNING * server_max:
        each = ", ".join(f"{host} {count}" for host, count in sorted(hosts.items()))
        report.warnings.append(
            f"The workers of {len(hosts)} host(s) may open {total} connections to database "
            f"{using!r} ({each}; job threads not counted), over "
            f"{int(CONNECTIONS_WARNING * 100)}% of its max_connections ({server_max}): the "
            "app's own processes may be refused. Lower --concurrency, or raise max_connections."
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
