from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from django_dbqueue import enqueue, enqueue_many
from testproject import jobs


class Command(BaseCommand):
    help = "Enqueue sample jobs for the demo: many that succeed and one that raises."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=2000)

    def handle(self, *args: Any, **options: Any) -> None:
        count = options["count"]
        with transaction.atomic():
            enqueue_many(
                {"task": jobs.send_welcome_mail, "args": [i]}
                if i % 2
                else {"task": jobs.checksum, "args": [f"document-{i}"]}
                for i in range(count)
            )
            enqueue(jobs.build_report, ["quarterly"])  # its queue and attempts come from @job
        self.stdout.write(f"Enqueued {count + 1} jobs ({count} that succeed, 1 that raises).")
