"""The ``WorkerProcess`` rows: who runs where, what it is running, and when it last beat."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, router, transaction
from django.db.models import Exists

from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue import clock
from django_dbqueue.status import CLAIMED

# Rows of processes silent for this long are deleted (the admin shows them as dead until
# then). Much longer than any lease: lease recovery reads the rows of dead workers.
DEAD_ROW_TTL = timedelta(hours=1)


def new_token() -> str:
    return uuid.uuid4().hex[:6]


def process_name(pid: int | None = None, token: str | None = None) -> str:
    """``host:pid:token``: the name a process claims jobs under (``Job.owner``)."""
    return f"{socket.gethostname()}:{pid or os.getpid()}:{token or new_token()}"


@dataclass
class Beat:
    """What one heartbeat writes to one row."""

    name: str
    done: int
    failed: int
    stopping: bool = False


def register(
    name: str, pid: int, role: str, queues: list[str], supervisor: str = ""
) -> WorkerProcess:
    """The process's row. Idempotent: a retry after a lost reply (the INSERT committed,
    then the connection died before saying so, as in a database restart) finds its own
    row instead of failing on the unique name.

    It tries the INSERT first. A read first (as ``update_or_create`` does) would make
    SQLite upgrade a read transaction to a write one, which fails at once with "database
    is locked" when another process wrote in between, instead of waiting its turn.
    """
    using = router.db_for_write(WorkerProcess)
    now = clock.now(using)  # the database's time, as every later heartbeat
    fields: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": pid,
        "role": role,
        "supervisor": supervisor,
        "queues": queues,
        "started_at": now,
        "heartbeat_at": now,
    }
    rows = WorkerProcess.objects.using(using)
    try:
        with transaction.atomic(using=using):
            return rows.create(name=name, **fields)
    except IntegrityError:
        rows.filter(name=name).update(**fields)
        return rows.get(name=name)


def beat(beats: list[Beat], clock_offset: float | None = None) -> None:
    """Write each row's heartbeat (the database's time) and this host's clock offset."""
    now = clock.now(router.db_for_write(WorkerProcess))
    for entry in beats:
        fields: dict[str, Any] = {
            "heartbeat_at": now,
            "clock_offset": clock_offset,
            "jobs_done": entry.done,
            "jobs_failed": entry.failed,
        }
        if entry.stopping:
            fields["stopping"] = True
        WorkerProcess.objects.filter(name=entry.name).update(**fields)


def show_running(name: str, job_id: int | None, since: datetime | None) -> None:
    """Name the job a process runs (or none). Lease recovery trusts a named job that is
    still claimed to be the one running, so a job is named only while it is claimed: a
    late write must not name a job that has already been recorded."""
    row = WorkerProcess.objects.filter(name=name)
    if job_id is not None:
        row = row.filter(Exists(Job.objects.filter(pk=job_id, status=CLAIMED, owner=name)))
    row.update(running_job_id=job_id, running_since=since)


def remove(*names: str) -> None:
    WorkerProcess.objects.filter(name__in=names).delete()


def prune() -> int:
    cutoff = clock.now(router.db_for_write(WorkerProcess)) - DEAD_ROW_TTL
    return WorkerProcess.objects.filter(heartbeat_at__lt=cutoff).delete()[0]
