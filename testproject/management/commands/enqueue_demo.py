from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from django_dbqueue import enqueue, enqueue_many
from testproject import demo_tasks


class Command(BaseCommand):
    help = "Enqueue sample jobs for the demo: many that succeed and one that raises."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=2000)

    def handle(self, *args: Any, **options: Any) -> None:
        count = options["count"]
        with transaction.atomic():
            enqueue_many(
                {"task": demo_tasks.send_welcome_mail, "args": [i], "queue": "emails"}
                if i % 2
                else {"task": demo_tasks.checksum, "args": [f"document-{i}"]}
                for i in range(count)
            )
            enqueue(demo_tasks.build_report, ["quarterly"], queue="reports", max_attempts=1)
        self.stdout.write(f"Enqueued {count + 1} jobs ({count} that succeed, 1 that raises).")
