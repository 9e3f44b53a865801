"""What the admin dashboard shows, computed with bounded, indexed queries.

Every query here reads an index range: counts are capped (``COUNT`` over a ``LIMIT``
subquery on the (status, queue) prefix of ``dbq_job_claim``), throughput reads
``dbq_job_finished`` for the last hour only, the oldest waiting job comes from the queue's
runnable range of ``dbq_job_claim`` (the backlog, never the history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import router
from django.db.models import Count
from django.db.models.functions import TruncMinute

from django_dbqueue.conf import settings
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue import counts
from django_dbqueue.queue.leases import alive_since

STATUSES: tuple[str, ...] = tuple(Job.Status.values)


@dataclass
class QueueRow:
    queue: str
    counts: list[tuple[str, int, bool]]  # (status, count, exact)
    oldest_id: int | None = None
    oldest_waiting: timedelta | None = None

    @property
    def oldest_label(self) -> str:
        return humanize(self.oldest_waiting) if self.oldest_waiting is not None else ""


@dataclass
class Bar:
    minute: datetime
    done: int
    failed: int
    x: float = 0.0
    done_y: float = 0.0
    done_height: float = 0.0
    failed_y: float = 0.0
    failed_height: float = 0.0


@dataclass
class Chart:
    bars: list[Bar]
    width: int
    height: int
    bar_width: float
    peak: int
    total_done: int
    total_failed: int
    ticks: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class WorkerRow:
    worker: WorkerProcess
    alive: bool
    seconds_since_heartbeat: float
    running_for: timedelta | None = None

    @property
    def heartbeat_label(self) -> str:
        return humanize(timedelta(seconds=self.seconds_since_heartbeat))

    @property
    def running_label(self) -> str:
        return humanize(self.running_for) if self.running_for is not None else ""

    @property
    def is_child(self) -> bool:
        return self.worker.role == WorkerProcess.Role.CHILD


@dataclass
class FailureRow:
    job: Job
    summary: str


def last_line(text: str, limit: int = 120) -> str:
    """The last non-blank line of a traceback: the exception and its message."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:limit] if lines else ""


def humanize(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def is_alive(worker: WorkerProcess, now: datetime) -> bool:
    """A worker is alive while its heartbeat is younger than the lease timeout."""
    return worker.heartbeat_at > alive_since(now)


def queue_rows(now: datetime, limit: int) -> list[QueueRow]:
    """One row per configured queue, in a few statements whatever the number of queues."""
    queues = list(settings.QUEUES)
    using = router.db_for_read(Job)
    counted = counts.capped_counts(Job, using, queues, STATUSES, limit)
    oldest = counts.oldest_runnable(Job, using, queues, now)
    rows = []
    for queue in queues:
        row = QueueRow(queue, [])
        for status in STATUSES:
            n = counted.get((queue, status), 0)
            row.counts.append((status, limit, False) if n > limit else (status, n, True))
        if queue in oldest:
            job_id, run_after = oldest[queue]
            row.oldest_id, row.oldest_waiting = job_id, now - run_after
        rows.append(row)
    return rows


def per_minute(status: str, since: datetime) -> dict[datetime, int]:
    rows = (
        Job.objects.finished_with(status)
        .filter(finished_at__gte=since)
        .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("minute", "n")
    )
    return {minute.astimezone(UTC): n for minute, n in rows}


def throughput_chart(
    now: datetime, minutes: int = 60, width: int = 960, height: int = 160
) -> Chart:
    """Done and failed jobs per minute over the last ``minutes``, laid out as SVG bars."""
    end = now.astimezone(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(minutes=minutes - 1)
    done = per_minute(Job.Status.DONE, start)
    failed = per_minute(Job.Status.FAILED, start)
    bars = [
        Bar(minute, done.get(minute, 0), failed.get(minute, 0))
        for minute in (start + timedelta(minutes=i) for i in range(minutes))
    ]
    peak = max([bar.done + bar.failed for bar in bars] + [1])
    slot = width / minutes
    scale = (height - 1) / peak
    for index, bar in enumerate(bars):
        bar.x = round(index * slot + 1, 2)
        bar.done_height = round(bar.done * scale, 2)
        bar.failed_height = round(bar.failed * scale, 2)
        bar.done_y = round(height - bar.done_height, 2)
        bar.failed_y = round(bar.done_y - bar.failed_height, 2)
    ticks = [
        (round(index * slot, 2), bars[index].minute.strftime("%H:%M"))
        for index in range(0, minutes, max(1, minutes // 6))
    ]
    return Chart(
        bars=bars,
        width=width,
        height=height,
        bar_width=round(max(slot - 2, 1), 2),
        peak=peak,
        total_done=sum(done.values()),
        total_failed=sum(failed.values()),
        ticks=ticks,
    )


def worker_rows(now: datetime) -> list[WorkerRow]:
    """Every process row, each supervisor followed by its children."""
    workers = list(WorkerProcess.objects.order_by("host", "pid", "name"))
    names = {worker.name for worker in workers}

    def place(worker: WorkerProcess) -> tuple[str, str, bool, int]:
        group = worker.supervisor if worker.supervisor in names else worker.name
        return (worker.host, group, worker.role == WorkerProcess.Role.CHILD, worker.pid)

    return [
        WorkerRow(
            worker,
            is_alive(worker, now),
            (now - worker.heartbeat_at).total_seconds(),
            now - worker.running_since if worker.running_since is not None else None,
        )
        for worker in sorted(workers, key=place)
    ]


def recent_failures(limit: int = 10) -> list[FailureRow]:
    jobs = (
        Job.objects.finished_with(Job.Status.FAILED)
        .order_by("-finished_at")
        .only("id", "task", "queue", "attempts", "max_attempts", "finished_at", "last_error")
    )
    return [FailureRow(job, last_line(job.last_error)) for job in jobs[:limit]]
