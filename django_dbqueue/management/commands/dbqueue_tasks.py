"""``manage.py dbqueue_tasks``: the tasks a worker of this project would run."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_dbqueue import registry
from django_dbqueue.conf import settings

COLUMNS = ("path", "kind", "queue", "priority", "max_attempts", "timeout", "retry_backoff")


def describe(entry: registry.RegisteredTask) -> dict[str, Any]:
    """One task's row: its own defaults, or the DBQUEUE ones it falls back on."""
    if entry.is_framework_task:
        task = entry.func
        return {
            "path": entry.path,
            "kind": "@task",
            "queue": task.queue_name,
            "priority": task.priority,
            "max_attempts": getattr(task, "max_attempts", None) or settings.MAX_ATTEMPTS,
            "timeout": getattr(task, "timeout", None) or settings.JOB_TIMEOUT,
            "retry_backoff": getattr(task, "retry_backoff", None) or settings.RETRY_BACKOFF,
        }
    defaults = entry.defaults
    return {
        "path": entry.path,
        "kind": "@job",
        "queue": defaults.get("queue", settings.DEFAULT_QUEUE),
        "priority": defaults.get("priority", settings.DEFAULT_PRIORITY),
        "max_attempts": defaults.get("max_attempts", settings.MAX_ATTEMPTS),
        "timeout": defaults.get("timeout", settings.JOB_TIMEOUT),
        "retry_backoff": defaults.get("retry_backoff", settings.RETRY_BACKOFF),
    }


class Command(BaseCommand):
    help = (
        "List the task registry: the @job functions and Django Tasks @task functions that "
        "workers run, found in every installed app's tasks.py and jobs.py and in "
        "DBQUEUE['TASK_MODULES']. A job whose task is not listed fails without running."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON list.")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = [describe(entry) for entry in registry.all_tasks()]
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write(
                "No registered tasks. Decorate functions with @job in an app's tasks.py or "
                "jobs.py, or list their modules in DBQUEUE['TASK_MODULES']."
            )
            return
        table = [COLUMNS] + [
            tuple("-" if row[c] is None else str(row[c]) for c in COLUMNS) for row in rows
        ]
        widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
        for line in table:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            )
        self.stdout.write(f"{len(rows)} task(s).")
