"""``manage.py dbqueue_queue pause|resume|list [QUEUE]``: a shell over queue/pausing.py."""

from __future__ import annotations

import getpass
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.queue import pausing


class Command(BaseCommand):
    help = "Pause or resume a queue (workers stop or start claiming from it), or list queues."

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
        paused = pausing.paused_queues()
        width = max(len(q) for q in settings.QUEUES)
        for queue in settings.QUEUES:
            waiting = Job.objects.filter(queue=queue, status=Job.Status.QUEUED).order_by()
            count = waiting[:10_001].count()
            label = f"{count:,}" if count <= 10_000 else "more than 10,000"
            state = "paused" if queue in paused else "running"
            self.stdout.write(f"{queue:<{width}}  {state:<7}  {label} queued")
