"""``dbqueue_bench``'s options, the parts it runs in order, and its report.

The management command is a shell over :func:`run`: it declares :data:`ARGUMENTS` and
prints what :func:`run` returns, as a table or as one JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import connections, router

from django_dbqueue.bench import baseline, runs, steady
from django_dbqueue.conf import settings
from django_dbqueue.management.commands.run_jobs import metrics_server, positive_int
from django_dbqueue.models import Job
from django_dbqueue.queue import announce

Say = Callable[[str], None]
PARTS = ("enqueue", "drain", "raw", "latency", "steady", "history", "duties")
# What runs without --only: the duties comparison drains several times over and is asked for.
DEFAULT_PARTS = ("enqueue", "drain", "raw", "latency", "steady", "history")
# (figure, its yardstick in the raw part): the share is reported when both were measured.
OF_RAW = (
    ("enqueue_single_per_s", "raw_enqueue_single_per_s"),
    ("raw_enqueue_single_bound_per_s", "raw_enqueue_single_per_s"),
    ("enqueue_bulk_per_s", "raw_enqueue_bulk_per_s"),
    ("drain_per_s", "raw_drain_per_s"),
)


def _count(default: int | None, text: str) -> dict[str, Any]:
    return {"type": positive_int, "default": default, "help": text}


# (flags, add_argument's keywords) of the command, in its --help order.
ARGUMENTS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--jobs",), _count(20_000, "Jobs per drain measurement (default 20000).")),
    (("--workers",), _count(2, "Worker processes draining (default 2).")),
    (
        ("--threads",),
        _count(1, "Threads per draining worker process (run_jobs --threads; default 1)."),
    ),
    (("--batch-size",), _count(None, "Claim batch size (default DBQUEUE['BATCH_SIZE']).")),
    (
        ("--job-ms",),
        {
            "type": float,
            "default": 0,
            "help": "Drained jobs sleep this many milliseconds (default 0: no-op jobs).",
        },
    ),
    (
        ("--keys",),
        _count(None, "Drained jobs take turns over this many concurrency keys (default: none)."),
    ),
    (("--key-limit",), _count(1, "concurrency_limit of each key with --keys (default 1).")),
    (("--single",), _count(2_000, "Jobs enqueued one at a time (default 2000).")),
    (("--bulk",), _count(50_000, "Jobs enqueued with enqueue_many (default 50000).")),
    (("--samples",), _count(200, "Idle pickup latency samples (default 200).")),
    (
        ("--rate",),
        _count(500, "Jobs/s the steady part's producer enqueues, one at a time (default 500)."),
    ),
    (("--seconds",), _count(10, "How long the steady part's producer runs (default 10 s).")),
    (
        ("--history",),
        _count(1_000_000, "Finished rows in the table for the last drain (default 1M)."),
    ),
    (
        ("--duty-history",),
        _count(
            200_000, "Old finished rows for retention to prune in the duties part (default 200k)."
        ),
    ),
    (("--rounds",), _count(3, "Interleaved rounds of the duties part (default 3).")),
    (
        ("--metrics-port",),
        _count(
            None,
            "Serve the worker metrics on this port during the drains (run_jobs "
            "--metrics-port), to weigh what they cost (default: off).",
        ),
    ),
    (
        ("--only",),
        {
            "action": "append",
            "choices": PARTS,
            "help": f"Run only these parts (repeatable; default: {', '.join(DEFAULT_PARTS)}).",
        },
    ),
    (("--json",), {"action": "store_true", "help": "Print one JSON object."}),
    (
        ("--yes",),
        {
            "action": "store_true",
            "help": "Do not ask before deleting the jobs already in the table.",
        },
    ),
)


class Refused(ValueError):
    """The options or the table do not allow a run (the command says why)."""


def run(options: dict[str, Any], say: Say) -> runs.Results:
    """Every asked-for part, in an order that keeps them from skewing each other."""
    parts = options["only"] or list(DEFAULT_PARTS)
    _check(options, parts)
    results = _start(options, say)
    runs.clear_jobs()
    if "drain" in parts:
        _drain(options, results, say)
    if "raw" in parts:
        _raw(options, results, say)
    # After the drains: a process that has just built and dropped 50,000 jobs forks
    # its draining workers with a heap several times larger, and on MariaDB they
    # drained 15-45% slower than the same drain in a new process (run_jobs forks its
    # workers from a small supervisor).
    if "enqueue" in parts:
        _enqueue(options, results, say)
    if "latency" in parts:
        _latency(options, results, say)
    if "steady" in parts:
        _steady(options, results, say)
    if "history" in parts:
        _history(options, results, say)
    if "duties" in parts:
        _duties(options, results, say)
    fig = results.figures
    for figure, raw in OF_RAW:
        if figure in fig and raw in fig:
            fig[figure.replace("_per_s", "_of_raw_pct")] = 100 * fig[figure] / fig[raw]
    if "drain_per_s" in fig and "simple_drain_per_s" in fig:
        fig["drain_of_simple_pct"] = 100 * fig["drain_per_s"] / fig["simple_drain_per_s"]
    return results


def _check(options: dict[str, Any], parts: list[str]) -> None:
    existing = Job.objects.count()
    if existing and not options["yes"]:
        raise Refused(
            f"The job table holds {existing} jobs and the benchmark deletes them all. "
            "Point it at a database of its own, or pass --yes."
        )
    if options["job_ms"] < 0:
        raise Refused("--job-ms cannot be negative.")
    if "drain" in parts and options["keys"] and options["key_limit"] > 1000:
        raise Refused("--key-limit is at most 1000.")


def _start(options: dict[str, Any], say: Say) -> runs.Results:
    using = router.db_for_write(Job)
    results = runs.Results(vendor=connections[using].vendor, workers=options["workers"])
    notes = results.notes
    notes["machine"] = runs.machine(using)
    notes["job_ms"] = options["job_ms"]
    notes["threads"] = options["threads"]
    notes["wakeup"] = announce.method()
    notes["metrics"] = bool(options["metrics_port"])
    say(
        f"dbqueue_bench on {results.vendor}, {options['workers']} worker process(es) x "
        f"{options['threads']} thread(s), wake-up: {notes['wakeup']}"
    )
    m = notes["machine"]
    say(
        f"  {m['cores']} cores, Python {m['python']}, Django {m['django']}, "
        f"{m['database']} {m['database_version']}"
    )
    return results


def _drain_once(options: dict[str, Any], **extra: Any) -> runs.Drained:
    # Made before the workers fork, as run_jobs does: they inherit it and count into it.
    server = metrics_server(options["metrics_port"])
    try:
        return runs.bench_drain(
            options["jobs"],
            options["workers"],
            options["batch_size"],
            options["job_ms"],
            threads=options["threads"],
            **extra,
        )
    finally:
        if server is not None:
            server.close()


def _drain(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    fig = results.figures
    if options["keys"]:
        results.notes["keys"] = options["keys"]
        results.notes["key_limit"] = options["key_limit"]
        fig["drain_keyed_per_s"] = _drain_once(
            options, keys=options["keys"], key_limit=options["key_limit"]
        ).rate
        say(
            f"  drain, {options['keys']} keys, limit {options['key_limit']}: "
            f"{fig['drain_keyed_per_s']:,.0f} jobs/s"
        )
    else:
        drained = _drain_once(options)
        fig["drain_per_s"] = drained.rate
        fig["drain_worker_cpu_us_per_job"] = drained.worker_cpu_us
        say(
            f"  drain, empty table:    {drained.rate:,.0f} jobs/s "
            f"(workers' CPU {drained.worker_cpu_us:.0f} us a job)"
        )
        if options["job_ms"]:
            # What the processes could do if the queue cost nothing.
            ideal = options["workers"] * options["threads"] * 1000 / options["job_ms"]
            fig["drain_of_ideal_pct"] = 100 * fig["drain_per_s"] / ideal
            say(f"  of {ideal:,.0f} jobs/s ideal:  {fig['drain_of_ideal_pct']:.0f}%")
    runs.clear_jobs()


def _enqueue(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    fig = results.figures
    fig["enqueue_single_per_s"] = runs.bench_enqueue_single(options["single"])
    say(f"  enqueue one at a time: {fig['enqueue_single_per_s']:,.0f} jobs/s")
    runs.clear_jobs()
    fig["enqueue_single_atomic_per_s"] = runs.bench_enqueue_single_atomic(options["single"])
    say(f"  ... each in atomic():  {fig['enqueue_single_atomic_per_s']:,.0f} jobs/s")
    runs.clear_jobs()
    own, caller = runs.bench_enqueue_in_transaction(options["single"])
    fig["enqueue_in_transaction_per_s"] = own
    fig["caller_transaction_per_s"] = caller
    say(
        f"  ... in a caller's writing transaction: {own:,.0f} jobs/s of the enqueue's "
        f"own time (the transaction alone: {caller:,.0f} /s)"
    )
    runs.clear_jobs()
    fig["enqueue_bulk_per_s"] = runs.bench_enqueue_bulk(options["bulk"])
    say(f"  enqueue_many:          {fig['enqueue_bulk_per_s']:,.0f} jobs/s")
    runs.clear_jobs()


def _latency(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    lat = runs.bench_latency(options["samples"])
    results.figures.update({f"latency_{k}_ms": v for k, v in lat.items()})
    say(
        f"  idle pickup latency:   p50 {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, "
        f"p99 {lat['p99']:.1f} ms"
    )
    runs.clear_jobs()


def _steady(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    rate, seconds = options["rate"], options["seconds"]
    results.notes["steady_rate_asked"] = rate
    results.notes["steady_seconds"] = seconds
    fig = steady.bench_steady(
        rate, seconds, options["workers"], options["batch_size"], str(settings.DEFAULT_QUEUE)
    )
    results.figures.update(fig)
    say(
        f"  pickup latency at {fig['steady_rate_per_s']:,.0f} jobs/s for {seconds} s: p50 "
        f"{fig['steady_pickup_p50_ms']:.1f} ms, p99 {fig['steady_pickup_p99_ms']:.1f} ms"
    )
    runs.clear_jobs()


def _history(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    seconds = runs.fill_history(options["history"], say)
    results.notes["history_rows"] = options["history"]
    results.notes["history_fill_s"] = round(seconds, 1)
    fig = results.figures
    fig["drain_with_history_per_s"] = _drain_once(options).rate
    say(
        f"  drain, {options['history']:,} finished rows: "
        f"{fig['drain_with_history_per_s']:,.0f} jobs/s"
    )
    runs.clear_jobs()


def _duties(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    say(
        f"  drain of {options['jobs']:,} jobs beside {options['duty_history']:,} old "
        "rows, the supervisors' duties idle and busy (a tick a second, retention "
        "pruning):"
    )
    fig = results.figures
    fig.update(
        runs.bench_duties(
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


def _raw(options: dict[str, Any], results: runs.Results, say: Say) -> None:
    """The yardstick: the same statements sent by the driver alone (bench/baseline.py)."""
    if results.vendor == "sqlite":
        say("  raw driver loops: server databases only")
        return
    fig = results.figures
    fig["raw_enqueue_single_per_s"] = baseline.raw_enqueue_single(options["single"])
    runs.clear_jobs()
    fig["raw_enqueue_single_bound_per_s"] = baseline.raw_enqueue_single(options["single"], True)
    runs.clear_jobs()
    fig["raw_enqueue_bulk_per_s"] = baseline.raw_enqueue_bulk(options["bulk"])
    runs.clear_jobs()
    if options["job_ms"] or options["keys"] or options["threads"] > 1:
        say("  raw drain: no-op jobs without keys or threads only")
    else:
        batch = options["batch_size"] or int(settings.BATCH_SIZE)
        drain = (options["jobs"], options["workers"], batch, str(settings.DEFAULT_QUEUE))
        fig["raw_drain_per_s"] = baseline.raw_drain(*drain)
        runs.clear_jobs()
        fig["simple_drain_per_s"] = baseline.simple_drain(*drain).per_s
        runs.clear_jobs()
    measured = [
        f"{name} {fig[key]:,.0f} /s"
        for name, key in (
            ("one at a time", "raw_enqueue_single_per_s"),
            ("one at a time, the driver binding", "raw_enqueue_single_bound_per_s"),
            ("bulk", "raw_enqueue_bulk_per_s"),
            ("drain", "raw_drain_per_s"),
        )
        if key in fig
    ]
    say("  the same statements, driver only: " + ", ".join(measured))
    if "simple_drain_per_s" in fig:
        say(f"  the simplest batch claim, driver only: drain {fig['simple_drain_per_s']:,.0f} /s")


def as_json(results: runs.Results) -> str:
    return json.dumps(
        {
            "vendor": results.vendor,
            "workers": results.workers,
            **{k: round(v, 2) for k, v in results.figures.items()},
            **results.notes,
        }
    )


def as_table(results: runs.Results) -> list[str]:
    lines = ["", f"{'measure':<34}{'value':>14}", "-" * 48]
    lines += [f"{key:<34}{value:>14,.1f}" for key, value in results.figures.items()]
    return lines
