"""Enqueueing due ticks of the recurring schedules, each exactly once across all hosts.

Every ``run_jobs`` supervisor runs a :class:`Ticker`. When a tick comes due, each of them
tries to INSERT its ``(schedule, tick_at)`` row and the job in one transaction; the
unique constraint lets exactly one succeed, whatever the number of hosts, and a host that
dies halfway leaves neither row nor job behind. No leader is elected, so none can be
partitioned away or overlap with its successor (docs/scheduling.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import IntegrityError, router, transaction
from django.db.models import Max

from django_dbqueue.enqueueing import enqueue
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import ScheduleTick
from django_dbqueue.queue import clock
from django_dbqueue.scheduling.recurring import (
    Schedule,
    Tick,
    collect_due_ticks,
    next_wakeup,
)
from django_dbqueue.scheduling.sources import all_schedules

logger = logging.getLogger("django_dbqueue.scheduling")
# However far away the next tick is, look again after this long: a clock that jumped
# back, or a schedule whose last tick was deleted, is noticed within a minute.
MAX_SLEEP = timedelta(seconds=60)
# Ticks of a schedule older than this are pruned, except each schedule's newest (which the
# missed-tick policy needs).
KEEP_TICKS = timedelta(days=7)


def last_ticks(names: Sequence[str]) -> dict[str, datetime]:
    """The newest enqueued tick of each schedule: one grouped read of the unique index."""
    if not names:
        return {}
    # The primary: a replica that lags would show a tick another host already enqueued
    # as not yet enqueued (the unique index refuses it, but every pass would try again).
    using = router.db_for_write(ScheduleTick)
    rows = (
        ScheduleTick.objects.using(using)
        .filter(schedule__in=list(names))
        .values("schedule")
        .annotate(last=Max("tick_at"))
        .values_list("schedule", "last")
    )
    return dict(rows)


def enqueue_tick(tick: Tick) -> ScheduleTick | None:
    """Record ``tick`` and enqueue its job in one transaction; None if another host did.

    A job that cannot be enqueued (its task or queue is gone: the system checks say so at
    start) is logged and its tick recorded without a job, so it is not retried every pass.
    """
    schedule = tick.schedule
    using = router.db_for_write(ScheduleTick)
    try:
        with transaction.atomic(using=using):
            row = ScheduleTick.objects.using(using).create(schedule=schedule.name, tick_at=tick.at)
            try:
                with transaction.atomic(using=using):
                    job = enqueue(
                        schedule.task,
                        list(schedule.args),
                        dict(schedule.kwargs),
                        **schedule.enqueue_options(),
                    )
            except InvalidJob as exc:
                logger.error("Schedule %r: tick %s not enqueued: %s", schedule.name, tick.at, exc)
                return row
            row.job_id = job.pk
            row.save(using=using, update_fields=["job_id"])
            return row
    except IntegrityError:
        return None  # another scheduler enqueued this tick first


def prune_ticks(now: datetime | None = None) -> int:
    """Delete old ticks, keeping each schedule's newest; returns how many went."""
    cutoff = (now or clock.queue_now()) - KEEP_TICKS
    using = router.db_for_write(ScheduleTick)
    deleted = 0
    for name, last in last_ticks(
        list(
            ScheduleTick.objects.using(using)
            .filter(tick_at__lt=cutoff)
            .values_list("schedule", flat=True)
            .distinct()
        )
    ).items():
        count, _ = (
            ScheduleTick.objects.using(using)
            .filter(schedule=name, tick_at__lt=min(cutoff, last))
            .delete()
        )
        deleted += count
    return deleted


class Ticker:
    """The scheduler pass a supervisor makes on every turn of its loop.

    Between ticks it costs a clock read: it looks at the database only when the next tick
    of some schedule has come (or after :data:`MAX_SLEEP`).
    """

    def __init__(self, schedules: Sequence[Schedule] | None = None) -> None:
        self.schedules = list(all_schedules() if schedules is None else schedules)
        self._next_look: datetime | None = None

    def run_due(self, now: datetime | None = None) -> list[ScheduleTick]:
        """Enqueue whatever is due; returns the ticks this process enqueued."""
        if not self.schedules:
            return []
        now = now or clock.queue_now()
        if self._next_look is not None and self._next_look - MAX_SLEEP <= now < self._next_look:
            return []
        due = collect_due_ticks(self.schedules, last_ticks([s.name for s in self.schedules]), now)
        enqueued = [row for tick in due if (row := enqueue_tick(tick)) is not None]
        upcoming = next_wakeup(self.schedules, now)
        self._next_look = min(upcoming, now + MAX_SLEEP) if upcoming else now + MAX_SLEEP
        return enqueued
