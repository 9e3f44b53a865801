"""``manage.py dbqueue_bench``: the queue's own benchmark (:mod:`django_dbqueue.bench.runs`)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router

from django_dbqueue.conf import settings
from django_dbqueue.management.commands.run_jobs import positive_int
from django_dbqueue.models import Job
from django_dbqueue.bench import baseline, bench

PARTS = ("enqueue", "drain", "raw", "latency", "history", "duties")
# What runs without --only: the duties comparison drains several times over and is asked for.
DEFAULT_PARTS = ("enqueue", "drain", "raw", "latency", "history")
# (figure, its yardstick in the raw part): the share is reported when both were measured.
OF_RAW = (
    ("enqueue_single_per_s", "raw_enqueue_single_per_s"),
    ("enqueue_bulk_per_s", "raw_enqueue_bulk_per_s"),
    ("drain_per_s", "raw_drain_per_s"),
)


class Command(BaseCommand):
    help = (
        "Benchmark the queue on the configured database with no-op jobs. DELETES every job "
        "in the table first: run it on a database of its own."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs",
            type=positive_int,
            default=20_000,
            help="Jobs per drain measurement (default 20000).",
        )
        parser.add_argument(
            "--workers", type=positive_int, default=2, help="Worker processes draining (default 2)."
        )
        parser.add_argument(
            "--threads",
            type=positive_int,
            default=1,
            help="Threads per draining worker process (run_jobs --threads; default 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="Claim batch size (default DBQUEUE['BATCH_SIZE']).",
        )
        parser.add_argument(
            "--job-ms",
            type=float,
            default=0,
            help="Drained jobs sleep this many milliseconds (default 0: no-op jobs).",
        )
        parser.add_argument(
            "--keys",
            type=positive_int,
            default=None,
            help="Drained jobs take turns over this many concurrency keys (default: none).",
        )
        parser.add_argument(
            "--key-limit",
            type=positive_int,
            default=1,
            help="concurrency_limit of each key with --keys (default 1).",
        )
        parser.add_argument(
            "--single",
            type=positive_int,
            default=2_000,
            help="Jobs enqueued one at a time (default 2000).",
        )
        parser.add_argument(
            "--bulk",
            type=positive_int,
            default=50_000,
            help="Jobs enqueued with enqueue_many (default 50000).",
        )
        parser.add_argument(
            "--samples",
            type=positive_int,
            default=200,
            help="Idle pickup latency samples (default 200).",
        )
        parser.add_argument(
            "--history",
            type=positive_int,
            default=1_000_000,
            help="Finished rows in the table for the last drain (default 1M).",
        )
        parser.add_argument(
            "--duty-history",
            type=positive_int,
            default=200_000,
            help="Old finished rows for retention to prune in the duties part (default 200k).",
        )
        parser.add_argument(
            "--rounds",
            type=positive_int,
            default=3,
            help="Interleaved rounds of the duties part (default 3).",
        )
        parser.add_argument(
            "--only",
            action="append",
            choices=PARTS,
            help=f"Run only these parts (repeatable; default: {', '.join(DEFAULT_PARTS)}).",
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        parser.add_argument(
            "--yes",
            action="store_true",
            help="Do not ask before deleting the jobs already in the table.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        parts = options["only"] or list(DEFAULT_PARTS)
        existing = Job.objects.count()
        if existing and not options["yes"]:
            raise CommandError(
                f"The job table holds {existing} jobs and the benchmark deletes them all. "
                "Point it at a database of its own, or pass --yes."
            )
        quiet = options["json"]

        def say(line: str) -> None:
            if not quiet:
                self.stdout.write(line)

        from django.db import connections

        using = router.db_for_write(Job)
        vendor = connections[using].vendor
        if options["job_ms"] < 0:
            raise CommandError("--job-ms cannot be negative.")
        results = bench.Results(vendor=vendor, workers=options["workers"])
        results.notes["machine"] = bench.machine(using)
        results.notes["job_ms"] = options["job_ms"]
        results.notes["threads"] = options["threads"]
        fig = results.figures
        from django_dbqueue.worker import wakeup

        results.notes["wakeup"] = wakeup.method()
        say(
            f"dbqueue_bench on {vendor}, {options['workers']} worker process(es) x "
            f"{options['threads']} thread(s), "
            f"wake-up: {results.notes['wakeup']}"
        )
        m = results.notes["machine"]
        say(
            f"  {m['cores']} cores, Python {m['python']}, Django {m['django']}, "
            f"{m['database']} {m['database_version']}"
        )
        bench.clear_jobs()
        if "drain" in parts and options["keys"]:
            if options["key_limit"] > 1000:
                raise CommandError("--key-limit is at most 1000.")
            results.notes["keys"] = options["keys"]
            results.notes["key_limit"] = options["key_limit"]
            fig["drain_keyed_per_s"] = bench.bench_drain(
                options["jobs"],
                options["workers"],
                options["batch_size"],
                options["job_ms"],
                keys=options["keys"],
                key_limit=options["key_limit"],
                threads=options["threads"],
            )
            say(
                f"  drain, {options['keys']} keys, limit {options['key_limit']}: "
                f"{fig['drain_keyed_per_s']:,.0f} jobs/s"
            )
            bench.clear_jobs()
        elif "drain" in parts:
            fig["drain_per_s"] = bench.bench_drain(
                options["jobs"],
                options["workers"],
                options["batch_size"],
                options["job_ms"],
                threads=options["threads"],
            )
            say(f"  drain, empty table:    {fig['drain_per_s']:,.0f} jobs/s")
            if options["job_ms"]:
                # What the processes could do if the queue cost nothing.
                ideal = options["workers"] * options["threads"] * 1000 / options["job_ms"]
                fig["drain_of_ideal_pct"] = 100 * fig["drain_per_s"] / ideal
                say(f"  of {ideal:,.0f} jobs/s ideal:  {fig['drain_of_ideal_pct']:.0f}%")
            bench.clear_jobs()
        if "raw" in parts:
            self._raw(options, results, say)
        # After the drains: a process that has just built and dropped 50,000 jobs forks
        # its draining workers with a heap several times larger, and on MariaDB they
        # drained 15-45% slower than the same drain in a new process (run_jobs forks its
        # workers from a small supervisor).
        if "enqueue" in parts:
            fig["enqueue_single_per_s"] = bench.bench_enqueue_single(options["single"])
            say(f"  enqueue one at a time: {fig['enqueue_single_per_s']:,.0f} jobs/s")
            bench.clear_jobs()
            fig["enqueue_single_atomic_per_s"] = bench.bench_enqueue_single_atomic(
                options["single"]
            )
            say(f"  ... each in atomic():  {fig['enqueue_single_atomic_per_s']:,.0f} jobs/s")
            bench.clear_jobs()
            own, caller = bench.bench_enqueue_in_transaction(options["single"])
            fig["enqueue_in_transaction_per_s"] = own
            fig["caller_transaction_per_s"] = caller
            say(
                f"  ... in a caller's writing transaction: {own:,.0f} jobs/s of the enqueue's "
                f"own time (the transaction alone: {caller:,.0f} /s)"
            )
            bench.clear_jobs()
            fig["enqueue_bulk_per_s"] = bench.bench_enqueue_bulk(options["bulk"])
            say(f"  enqueue_many:          {fig['enqueue_bulk_per_s']:,.0f} jobs/s")
            bench.clear_jobs()
        if "latency" in parts:
            lat = bench.bench_latency(options["samples"])
            fig.update({f"latency_{k}_ms": v for k, v in lat.items()})
            say(
                f"  idle pickup latency:   p50 {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, "
                f"p99 {lat['p99']:.1f} ms"
            )
            bench.clear_jobs()
        if "history" in parts:
            seconds = bench.fill_history(options["history"], say)
            results.notes["history_rows"] = options["history"]
            results.notes["history_fill_s"] = round(seconds, 1)
            fig["drain_with_history_per_s"] = bench.bench_drain(
                options["jobs"],
                options["workers"],
                options["batch_size"],
                options["job_ms"],
                threads=options["threads"],
            )
            say(
                f"  drain, {options['history']:,} finished rows: "
                f"{fig['drain_with_history_per_s']:,.0f} jobs/s"
            )
            bench.clear_jobs()
        if "duties" in parts:
            say(
                f"  drain of {options['jobs']:,} jobs beside {options['duty_history']:,} old "
                "rows, the supervisors' duties idle and busy (a tick a second, retention "
                "pruning):"
            )
            fig.update(
                bench.bench_duties(
                    options["jobs"],
                    options["workers"],
                    options["batch_size"],
                    options["duty_history"],
                    options["rounds"],
                    say,
                )
            )
            say(
                f"  duties cost the drain {fig['duties_cost_pct']:.1f}% (medians; "
                f"{fig['duties_pruned_per_round']:,.0f} rows pruned per busy drain)"
            )
        for figure, raw in OF_RAW:
            if figure in fig and raw in fig:
                fig[figure.replace("_per_s", "_of_raw_pct")] = 100 * fig[figure] / fig[raw]
        if quiet:
            self.stdout.write(
                json.dumps(
                    {
                        "vendor": results.vendor,
                        "workers": results.workers,
                        **{k: round(v, 2) for k, v in fig.items()},
                        **results.notes,
                    }
                )
            )
        else:
            self._table(results)

    def _raw(self, options: dict[str, Any], results: bench.Results, say: Any) -> None:
        """The yardstick: the same statements sent by the driver alone (bench/baseline.py)."""
        if results.vendor == "sqlite":
            say("  raw driver loops: server databases only")
            return
        fig = results.figures
        fig["raw_enqueue_single_per_s"] = baseline.raw_enqueue_single(options["single"])
        bench.clear_jobs()
        fig["raw_enqueue_bulk_per_s"] = baseline.raw_enqueue_bulk(options["bulk"])
        bench.clear_jobs()
        if options["job_ms"] or options["keys"] or options["threads"] > 1:
            say("  raw drain: no-op jobs without keys or threads only")
        else:
            batch = options["batch_size"] or int(settings.BATCH_SIZE)
            fig["raw_drain_per_s"] = baseline.raw_drain(
                options["jobs"], options["workers"], batch, str(settings.DEFAULT_QUEUE)
            )
            bench.clear_jobs()
        say(
            "  the same statements, driver only: "
            + ", ".join(
                f"{name} {fig[key]:,.0f} /s"
                for name, key in (
                    ("one at a time", "raw_enqueue_single_per_s"),
                    ("bulk", "raw_enqueue_bulk_per_s"),
                    ("drain", "raw_drain_per_s"),
                )
                if key in fig
            )
        )

    def _table(self, results: bench.Results) -> None:
        self.stdout.write("")
        self.stdout.write(f"{'measure':<34}{'value':>14}")
        self.stdout.write("-" * 48)
        for key, value in results.figures.items():
            self.stdout.write(f"{key:<34}{value:>14,.1f}")
