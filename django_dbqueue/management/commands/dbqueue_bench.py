"""``manage.py dbqueue_bench``: the queue's own benchmark, a shell over
:mod:`django_dbqueue.bench.plan`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_dbqueue.bench import plan


class Command(BaseCommand):
    help = (
        "Benchmark the queue on the configured database with no-op jobs. DELETES every job "
        "in the table first: run it on a database of its own."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        for flags, keywords in plan.ARGUMENTS:
            parser.add_argument(*flags, **keywords)

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = options["json"]

        def say(line: str) -> None:
            if not quiet:
                self.stdout.write(line)

        try:
            results = plan.run(options, say)
        except plan.Refused as exc:
            raise CommandError(str(exc)) from None
        if quiet:
            self.stdout.write(plan.as_json(results))
        else:
            for line in plan.as_table(results):
                self.stdout.write(line)
