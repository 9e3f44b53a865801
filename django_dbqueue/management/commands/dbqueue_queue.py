"""``manage.py dbqueue_queue pause|resume|list [QUEUE]``: a shell over queue/pausing.py."""

from __future__ import annotations

import getpass
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.queue import clock, counts, pausing
from django_dbqueue.status import CLAIMED, QUEUED

COUNT_LIMIT = 10_000  # counts stop here, as the dashboard's do


class Command(BaseCommand):
    help = (
        "Pause or resume a queue (workers stop or start claiming from it), or list the "
        "queues with their state, depth and lag."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "list"])
        parser.add_argument("queue", nargs="?", help="the queue to pause or resume")

    def handle(self, *args: Any, action: str, queue: str | None, **options: Any) -> None:
        if action == "list":
            self._list()
            return
        if queue is None:
            raise CommandError(f"Name the queue to {action}: dbqueue_queue {action} QUEUE")
        by = f"{getpass.getuser()}@{socket.gethostname()} (dbqueue_queue)"
        try:
            changed = pausing.pause(queue, by) if action == "pause" else pausing.resume(queue, by)
        except InvalidJob as exc:
            raise CommandError(str(exc)) from None
        state = "paused" if action == "pause" else "running"
        if changed:
            self.stdout.write(f"Queue {queue!r} is now {state}.")
        else:
            self.stdout.write(f"Queue {queue!r} was already {state}.")

    def _list(self) -> None:
        """Each queue: paused or running, its depth (capped counts) and its lag (how long
        its oldest runnable job has been waiting), in the dashboard's bounded queries."""
        queues, paused, now = list(settings.QUEUES), pausing.paused_queues(), clock.queue_now()
        using = router.db_for_write(Job)
        counted = counts.capped_counts(Job, using, queues, [QUEUED, CLAIMED], COUNT_LIMIT)
        oldest = counts.oldest_runnable(Job, using, queues, now)
        width = max(len(q) for q in queues)
        self.stdout.write(f"{'queue':<{width}}  state     queued  running  lag")
        for queue in queues:
            state = "paused" if queue in paused else "running"
            depth = [capped(counted.get((queue, status), 0)) for status in (QUEUED, CLAIMED)]
            lag = "-"
            if queue in oldest:
                job_id, run_after = oldest[queue]
                lag = f"{max(0.0, (now - run_after).total_seconds()):.1f} s (job #{job_id})"
            self.stdout.write(f"{queue:<{width}}  {state:<7} {depth[0]:>8} {depth[1]:>8}  {lag}")


def capped(count: int) -> str:
    return f"{count:,}" if count <= COUNT_LIMIT else f">{COUNT_LIMIT:,}"
