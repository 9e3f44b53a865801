"""``manage.py dbqueue_tasks``: the tasks a worker of this project would run."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_dbqueue import registry
from django_dbqueue.options import OPTIONS, effective

# The options a task may set for all its jobs that fall back on a setting.
LISTED = tuple(o for o in OPTIONS if o.job_default and o.setting)
COLUMNS = ("path", "kind", *(option.name for option in LISTED))


def describe(entry: registry.RegisteredTask) -> dict[str, Any]:
    """One task's row: its own defaults, or the DBQUEUE ones it falls back on."""
    if entry.is_framework_task:
        task = entry.func
        own = {o.name: getattr(task, o.task_field or o.name, None) for o in LISTED}
    else:
        own = entry.defaults
    return {
        "path": entry.path,
        "kind": "@task" if entry.is_framework_task else "@job",
        **{option.name: effective(option, own.get(option.name)) for option in LISTED},
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
