"""``manage.py dbqueue_jobs list|show|requeue|cancel|retry-failed``: the operator's shell
over queue/actions.py, the same operations the admin's actions run (in chunks of ids).

Arguments, keyword arguments and results are payloads (they may hold personal data or
secrets): ``show`` prints them only with ``--payloads``. A shell on a worker host holds
the database's credentials, so the admin's permission rule cannot stop it from reading
them; the flag keeps them off screens, scrollback and pasted logs unless asked for.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q
from django.utils import timezone

from django_dbqueue.admin.chunked import apply_in_chunks
from django_dbqueue.management.commands.prune_jobs import duration
from django_dbqueue.management.commands.run_jobs import positive_int
from django_dbqueue.models import Job
from django_dbqueue.queue import clock
from django_dbqueue.queue.actions import JobQuerySet
from django_dbqueue.status import FAILED, JobStatus

LIST_FIELDS = (
    "id", "status", "queue", "task", "priority", "attempts", "max_attempts",
    "run_after", "created_at", "started_at", "finished_at", "owner", "unique_key",
    "concurrency_key", "last_error",
)  # fmt: skip
PAYLOADS = ("args", "kwargs", "result")
FILTERS = ("queue", "task", "key", "since", "status")


def add_filters(parser: ArgumentParser, since_help: str) -> None:
    parser.add_argument("--queue", action="append", help="only this queue (repeatable)")
    parser.add_argument("--task", help="only this task (its dotted path)")
    parser.add_argument(
        "--key",
        help="only jobs of this concurrency key, or waiting and running jobs of this unique key",
    )
    parser.add_argument("--since", type=duration, help=since_help)


def add_selection(parser: ArgumentParser, verb: str) -> None:
    parser.add_argument("ids", nargs="*", type=positive_int, help=f"the jobs to {verb}")
    add_filters(parser, "only jobs created this long ago or less (90s, 15m, 12h, 7d)")
    parser.add_argument(
        "--status", action="append", choices=JobStatus.values, help="only this status"
    )
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")


class Command(BaseCommand):
    help = "List, show, requeue or cancel jobs; retry the failed ones."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        listing = actions.add_parser("list", help="the newest jobs that match")
        add_filters(listing, "only jobs created this long ago or less (90s, 15m, 12h, 7d)")
        listing.add_argument("--status", action="append", choices=JobStatus.values)
        listing.add_argument("--limit", type=positive_int, default=50, help="default 50")
        listing.add_argument("--json", action="store_true", help="one JSON array")
        show = actions.add_parser("show", help="one job, with its error history")
        show.add_argument("id", type=positive_int)
        show.add_argument("--json", action="store_true", help="one JSON object")
        show.add_argument("--payloads", action="store_true", help="with args, kwargs, result")
        requeue = actions.add_parser("requeue", help="failed, cancelled or done jobs, again")
        add_selection(requeue, "requeue")
        requeue.add_argument("--run-now", action="store_true", help="runnable at once")
        add_selection(actions.add_parser("cancel", help="queued or running jobs"), "cancel")
        retry = actions.add_parser("retry-failed", help="requeue every failed job that matches")
        add_filters(retry, "only jobs that failed this long ago or less (90s, 15m, 12h, 7d)")
        retry.add_argument("--dry-run", action="store_true", help="count, change nothing")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        handler = {
            "list": self.list_jobs,
            "show": self.show_job,
            "requeue": self.requeue,
            "cancel": self.cancel,
            "retry-failed": self.retry_failed,
        }[action]
        handler(options)

    # -- reading ---------------------------------------------------------------------

    def list_jobs(self, options: dict[str, Any]) -> None:
        jobs = list(selected(options).order_by("-pk").values(*LIST_FIELDS)[: options["limit"]])
        if options["json"]:
            self.stdout.write(json.dumps(jobs, cls=DjangoJSONEncoder, indent=2))
            return
        for job in jobs:
            error = job["last_error"].strip().splitlines()[-1:] if job["last_error"] else []
            self.stdout.write(
                f"#{job['id']:<8} {job['status']:<9} {job['queue']:<12} {job['task']}  "
                f"attempts {job['attempts']}/{job['max_attempts']}  "
                f"{when(job)}{'  ' + error[0][:80] if error else ''}"
            )
        if not jobs:
            self.stdout.write("No job matches.")

    def show_job(self, options: dict[str, Any]) -> None:
        fields = LIST_FIELDS + ("errors",) + (PAYLOADS if options["payloads"] else ())
        job = Job.objects.filter(pk=options["id"]).values(*fields).first()
        if job is None:
            raise CommandError(f"There is no job #{options['id']}.")
        if options["json"]:
            self.stdout.write(json.dumps(job, cls=DjangoJSONEncoder, indent=2))
            return
        for name in fields:
            if name in {"errors", "last_error"} or job[name] in (None, ""):
                continue
            value = json.dumps(job[name]) if name in PAYLOADS else display(job[name])
            self.stdout.write(f"{name:>16}: {value}")
        if not options["payloads"]:
            self.stdout.write(f"{'payloads':>16}: hidden (--payloads shows args, kwargs, result)")
        for error in job["errors"] or []:
            if isinstance(error, dict):
                self.stdout.write(f"\nearlier attempt, {error.get('at', '?')}:")
                self.stdout.write(str(error.get("traceback", "")).rstrip())
        if job["last_error"]:
            self.stdout.write(f"\nlast error:\n{job['last_error'].rstrip()}")

    # -- changing --------------------------------------------------------------------

    def requeue(self, options: dict[str, Any]) -> None:
        self._requeue(selected(options, require=True), options["dry_run"], options["run_now"])

    def retry_failed(self, options: dict[str, Any]) -> None:
        since = options.pop("since")
        failed = selected(options).finished_with(FAILED)
        if since is not None:
            failed = failed.filter(finished_at__gte=clock.queue_now() - since)
        self._requeue(failed, options["dry_run"], run_now=False)

    def _requeue(self, jobs: JobQuerySet, dry_run: bool, run_now: bool) -> None:
        if dry_run:
            count = jobs.filter(status__in=Job.FINISHED).count()
            self.stdout.write(f"Would requeue {count:,} job(s) (dry run: nothing changed).")
            return
        selected_count, reports = apply_in_chunks(jobs, lambda qs: qs.requeue_report(run_now))
        requeued = sum(report.requeued for report in reports)
        self.stdout.write(f"Requeued {requeued:,} of {selected_count:,} selected job(s).")
        for report in reports:
            if report.key_held:
                self.stdout.write(report.describe())

    def cancel(self, options: dict[str, Any]) -> None:
        jobs = selected(options, require=True)
        if options["dry_run"]:
            queued = jobs.filter(status=JobStatus.QUEUED).count()
            running = jobs.filter(status=JobStatus.CLAIMED).count()
            self.stdout.write(
                f"Would cancel {queued:,} queued job(s) and ask the workers of {running:,} "
                "running job(s) to stop them (dry run: nothing changed)."
            )
            return
        _, results = apply_in_chunks(jobs, lambda qs: qs.cancel())
        cancelled, asked = sum(r[0] for r in results), sum(r[1] for r in results)
        self.stdout.write(
            f"Cancelled {cancelled:,} queued job(s); asked the workers of {asked:,} "
            "running job(s) to stop them."
        )


def selected(options: dict[str, Any], require: bool = False) -> JobQuerySet:
    """The jobs the ids and filters of ``options`` name; ``require``: refuse to act on the
    whole table when neither is given."""
    if require and not options.get("ids") and not any(options.get(n) for n in FILTERS):
        raise CommandError("Name the jobs: their ids, or filters (--queue, --task, ...).")
    jobs = Job.objects.all()
    if options.get("ids"):
        jobs = jobs.filter(pk__in=options["ids"])
    if options.get("queue"):
        jobs = jobs.filter(queue__in=options["queue"])
    if options.get("task"):
        jobs = jobs.filter(task=options["task"])
    if options.get("status"):
        jobs = jobs.filter(status__in=options["status"])
    if options.get("key"):
        # Both columns have an index; a finished job's unique key is cleared (so it
        # can be used again), so only waiting and running jobs match by unique key.
        jobs = jobs.filter(Q(unique_key=options["key"]) | Q(concurrency_key=options["key"]))
    if options.get("since") is not None:
        jobs = jobs.filter(created_at__gte=clock.queue_now() - options["since"])
    return jobs


def when(job: dict[str, Any]) -> str:
    if job["finished_at"] is not None:
        return f"finished {display(job['finished_at'])}"
    if job["status"] == JobStatus.CLAIMED:
        return f"running on {job['owner']}"
    return f"runs after {display(job['run_after'])}"


def display(value: Any) -> str:
    if isinstance(value, datetime):
        return timezone.localtime(value).isoformat(sep=" ", timespec="milliseconds")
    return str(value)
