"""``manage.py dbqueue_health``: exit 0 when healthy, else 1 with one line per problem
(a thin shell over :mod:`django_dbqueue.observability.health`)."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_dbqueue.management.commands.run_jobs import positive_float
from django_dbqueue.observability import health


class Command(BaseCommand):
    help = (
        "Check the queue's health for a probe or watchdog: this host's run_jobs supervisor "
        "is alive and the database answers (--ready: the database answers and is migrated)."
    )
    # A database that is down must give one line and exit 1, not a check's traceback.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ready",
            action="store_true",
            help="Readiness: the database answers and is migrated (no supervisor needed).",
        )
        parser.add_argument(
            "--max-lag",
            type=positive_float,
            default=None,
            metavar="SECONDS",
            help="Also fail when a queue's oldest due job has waited longer than this.",
        )
        parser.add_argument(
            "--max-heartbeat-age",
            type=positive_float,
            default=None,
            metavar="SECONDS",
            help="A supervisor whose last heartbeat is older is dead "
            "(default 3 x DBQUEUE['HEARTBEAT_INTERVAL']).",
        )
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        report = health.check(
            ready=options["ready"],
            max_lag=options["max_lag"],
            max_heartbeat_age=options["max_heartbeat_age"],
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), sort_keys=True))
        else:
            for problem in report.problems:
                self.stderr.write(problem)
            for warning in report.warnings:
                self.stderr.write(f"Warning: {warning}")
            if report.ok and int(options["verbosity"]) >= 1:
                self.stdout.write("OK")
        if not report.ok:
            sys.exit(1)
