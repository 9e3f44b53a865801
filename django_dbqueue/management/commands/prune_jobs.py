"""``manage.py prune_jobs``: delete old finished jobs now (queue/retention.py)."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_dbqueue.management.commands.run_jobs import positive_int
from django_dbqueue.queue import clock, retention
from django_dbqueue.status import FINISHED

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(value: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 3600, 90s, 15m, 12h, 7d or 2w, got {value!r}"
        )
    seconds = float(match[1]) * UNITS[match[2] or "s"]
    if seconds > 100 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"{value!r} is longer than 100 years")
    return timedelta(seconds=seconds)


class Command(BaseCommand):
    help = (
        "Delete finished jobs older than DBQUEUE['RETENTION'] (or --older-than), in short "
        "batches by primary key."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration,
            help="age instead of DBQUEUE['RETENTION'] (3600, 90s, 15m, 12h, 7d, 2w)",
        )
        parser.add_argument(
            "--status",
            action="append",
            choices=list(FINISHED),
            help="only jobs of this status (repeatable; default: done, failed, cancelled)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--batch-size", type=positive_int, help="rows per DELETE")

    def handle(self, *args: Any, **options: Any) -> None:
        statuses: list[str] = options["status"] or list(FINISHED)
        if options["older_than"] is not None:
            policy: dict[str, timedelta | None] = dict.fromkeys(statuses, options["older_than"])
        else:
            try:
                policy = retention.retention_policy()
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        targets = retention.cutoffs(policy, clock.queue_now(fresh=True), statuses)
        kept = sorted(set(statuses) - {t.status for t in targets})
        for status in kept:
            self.stdout.write(f"{status}: kept forever (DBQUEUE['RETENTION'][{status!r}] is None)")
        if options["dry_run"]:
            for target in targets:
                count = retention.prunable(target)
                self.stdout.write(
                    f"{target.status}: would delete {count:,} job(s) finished before "
                    f"{target.before.isoformat(timespec='seconds')}"
                )
            return
        progress: dict[str, int] = {}

        def on_batch(status: str, count: int) -> None:
            progress[status] = progress.get(status, 0) + count
            self.stdout.write(f"{status}: deleted {progress[status]:,} so far")

        deleted, _ = retention.prune(targets, options["batch_size"], on_batch=on_batch)
        self.stdout.write(f"Deleted {deleted:,} finished job(s).")
