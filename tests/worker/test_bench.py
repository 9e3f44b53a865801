"""The benchmark command runs and reports sane figures on a small size."""

from __future__ import annotations

import json
import os
import socket
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_bench_reports_every_figure_as_json() -> None:
    out = StringIO()
    call_command(
        "dbqueue_bench",
        "--jobs",
        "300",
        "--single",
        "50",
        "--bulk",
        "300",
        "--samples",
        "10",
        "--rate",
        "50",
        "--seconds",
        "1",
        "--history",
        "2000",
        "--workers",
        "2",
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    assert report["workers"] == 2
    assert report["history_rows"] == 2000
    for key in (
        "enqueue_single_per_s",
        "enqueue_single_atomic_per_s",
        "enqueue_bulk_per_s",
        "drain_per_s",
        "drain_with_history_per_s",
    ):
        assert 10 < report[key] < 10_000_000, (key, report[key])
    # The workers' own CPU: something, and less than the drain's whole time a job on
    # every core of the machine.
    cpu = report["drain_worker_cpu_us_per_job"]
    assert 0 < cpu < os.cpu_count() * 1e6 / report["drain_per_s"], cpu
    assert 0 < report["latency_p50_ms"] <= report["latency_p90_ms"] <= report["latency_p99_ms"]
    assert report["latency_p99_ms"] < 5_000
    assert report["steady_rate_asked"] == 50 and report["steady_seconds"] == 1
    assert 0 < report["steady_rate_per_s"] <= 50 * 1.05
    assert 0 <= report["steady_pickup_p50_ms"] <= report["steady_pickup_p99_ms"]
    # Beside them, on a server, the same statements sent by the driver alone.
    shares = ("enqueue_single", "enqueue_bulk", "drain")
    if connection.vendor == "sqlite":
        assert not [key for key in report if "raw" in key or "simple" in key]
    else:
        for name in shares:
            raw = report[f"raw_{name}_per_s"]
            assert 10 < raw < 10_000_000, (name, raw)
            share = report[f"{name}_of_raw_pct"]
            assert share == pytest.approx(100 * report[f"{name}_per_s"] / raw, rel=1e-3)
        # The driver binding enqueue's values itself, as a share of the finished text.
        bound = report["raw_enqueue_single_bound_per_s"]
        assert 10 < bound < 10_000_000, bound
        share = report["raw_enqueue_single_bound_of_raw_pct"]
        assert share == pytest.approx(100 * bound / report["raw_enqueue_single_per_s"], rel=1e-3)
        # And the simplest batch claim, run by as many processes in the same run.
        simple = report["simple_drain_per_s"]
        assert 10 < simple < 10_000_000, simple
        share = report["drain_of_simple_pct"]
        assert share == pytest.approx(100 * report["drain_per_s"] / simple, rel=1e-3)
    assert Job.objects.count() == 0, "the benchmark cleans up after itself"


@pytest.mark.only_vendor("mysql", "postgresql")
def test_raw_loops_do_the_queues_work_with_the_driver_alone() -> None:
    from django_dbqueue.bench import baseline

    assert baseline.raw_enqueue_single(20) > 0
    inserted = list(Job.objects.values_list("task", "status", "queue", "args", "kwargs"))
    # The replayed INSERT is enqueue()'s own: the same row as a real no-op enqueue.
    assert inserted == [("django_dbqueue.bench.runs.noop", "queued", "default", [], {})] * 20
    Job.objects.all().delete()
    assert baseline.raw_enqueue_single(20, bound=True) > 0
    bound = list(Job.objects.values_list("task", "status", "queue", "args", "kwargs"))
    assert bound == inserted, "the values the driver binds are enqueue()'s too"
    Job.objects.all().delete()
    assert baseline.raw_enqueue_bulk(2500) > 0
    assert Job.objects.filter(status=Job.Status.QUEUED).count() == 2500
    Job.objects.all().delete()
    assert baseline.raw_drain(3000, 2, 100, "default") > 0
    owners = set(Job.objects.values_list("owner", flat=True))
    assert Job.objects.filter(status=Job.Status.DONE, attempts=1).count() == 3000
    assert len(owners) == 2 and all(o.startswith(baseline.RAW_OWNER) for o in owners), owners


@pytest.mark.only_vendor("mysql", "postgresql")
def test_simple_drain_takes_every_job_exactly_once_between_its_processes() -> None:
    from django_dbqueue.bench import baseline

    drained = baseline.simple_drain(3000, 2, 100, "default")
    assert drained.per_s > 0
    # Every job done, and the two processes took 3000 between them: none took a job
    # another one took (a job taken twice would count twice). How they shared them is
    # the scheduler's: on a loaded machine one took all 3000 before the other's first
    # claim (CI simulation).
    assert Job.objects.filter(status=Job.Status.DONE).count() == 3000
    assert len(drained.taken) == 2 and sum(drained.taken) == 3000, drained.taken
    # The simplest claim writes the status alone: no owner, no attempt counted.
    assert not Job.objects.exclude(owner="").exists()
    assert not Job.objects.exclude(attempts=0).exists()


def test_steady_load_runs_every_produced_job_once() -> None:
    from django_dbqueue.bench import steady

    figures = steady.bench_steady(40, 2, 2, None, "default")
    # 80 jobs produced one at a time, each run once, by a worker that was waiting.
    assert Job.objects.count() == 80
    assert Job.objects.filter(status=Job.Status.DONE, attempts=1).count() == 80
    assert set(figures) == {"steady_pickup_p50_ms", "steady_pickup_p99_ms", "steady_rate_per_s"}
    assert 0 <= figures["steady_pickup_p50_ms"] <= figures["steady_pickup_p99_ms"]
    assert 0 < figures["steady_rate_per_s"] <= 40 * 1.05


def test_bench_prints_a_table() -> None:
    out = StringIO()
    call_command("dbqueue_bench", "--only", "drain", "--jobs", "200", "--workers", "1", stdout=out)
    text = out.getvalue()
    assert "drain, empty table:" in text
    assert "drain_per_s" in text


def test_bench_refuses_to_delete_existing_jobs() -> None:
    enqueue(jobs.noop)
    with pytest.raises(CommandError, match="deletes them all"):
        call_command("dbqueue_bench", "--only", "drain", "--jobs", "10")
    assert Job.objects.count() == 1


def test_bench_drains_jobs_of_a_given_duration_and_names_the_machine() -> None:
    out = StringIO()
    call_command(
        "dbqueue_bench",
        "--only",
        "drain",
        "--jobs",
        "100",
        "--job-ms",
        "20",
        "--workers",
        "2",
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    assert report["job_ms"] == 20
    # 100 jobs of 20 ms on 2 processes: 100 jobs/s at best; slower than no-op jobs.
    assert report["drain_per_s"] <= 100 * 1.05
    assert report["drain_of_ideal_pct"] == pytest.approx(report["drain_per_s"])
    machine = report["machine"]
    assert machine["cores"] >= 1
    assert machine["python"].count(".") == 2
    assert machine["django"].startswith(("5.", "6."))
    assert machine["database"] == connection.vendor
    assert machine["database_version"][0].isdigit()


def test_bench_passes_threads_to_the_workers() -> None:
    out = StringIO()
    call_command(
        "dbqueue_bench",
        "--only",
        "drain",
        "--jobs",
        "60",
        "--job-ms",
        "100",
        "--workers",
        "1",
        "--threads",
        "6",
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    assert (report["workers"], report["threads"], report["job_ms"]) == (1, 6, 100)
    # Jobs of 100 ms run one at a time cannot pass 10 jobs/s: above that, jobs ran side by
    # side (six threads reach about 60 on a quiet machine; a loaded one gets less).
    assert report["drain_per_s"] > 10
    assert report["drain_of_ideal_pct"] == pytest.approx(report["drain_per_s"] * 100 / 60, abs=0.1)


def test_bench_refuses_a_negative_job_time() -> None:
    with pytest.raises(CommandError, match="negative"):
        call_command("dbqueue_bench", "--only", "drain", "--jobs", "10", "--job-ms", "-1")


def test_bench_drains_keyed_jobs() -> None:
    out = StringIO()
    call_command(
        "dbqueue_bench",
        *("--only", "drain", "--jobs", "200", "--workers", "2", "--keys", "10"),
        *("--key-limit", "2", "--json"),
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert result["drain_keyed_per_s"] > 0 and "drain_per_s" not in result
    assert (result["keys"], result["key_limit"]) == (10, 2)
    assert not Job.objects.exists(), "the keyed jobs were drained and cleared"


def test_bench_compares_a_drain_with_the_duties_idle_and_busy() -> None:
    out = StringIO()
    call_command(
        "dbqueue_bench",
        *("--only", "duties", "--jobs", "300", "--workers", "2", "--duty-history", "3000"),
        *("--rounds", "2", "--json"),
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert result["drain_duties_idle_per_s"] > 0 and result["drain_duties_busy_per_s"] > 0
    idle, busy = result["drain_duties_idle_per_s"], result["drain_duties_busy_per_s"]
    assert result["duties_cost_pct"] == pytest.approx(100 * (idle - busy) / idle, abs=0.01)
    # The busy drains really pruned: each supervisor takes its turn as it starts.
    assert result["duties_pruned_per_round"] > 0
    assert not Job.objects.exists(), "the benchmark cleans up after itself"


def test_bench_drains_with_the_worker_metrics_served() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = StringIO()
    # The port is taken (by the probe): refused before anything is enqueued.
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"Cannot serve metrics on port {busy}"):
            call_command(
                "dbqueue_bench", "--only", "drain", "--jobs", "50", "--metrics-port", str(busy)
            )
    assert not Job.objects.exists()
    # And nothing of the metrics is left set in this process.
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    call_command(
        "dbqueue_bench",
        "--only",
        "drain",
        "--jobs",
        "200",
        "--workers",
        "1",
        "--metrics-port",
        str(port),
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    assert report["metrics"] is True
    assert report["drain_per_s"] > 0
    # The server went with the drain: its port is free again.
    with socket.socket() as again:
        again.bind(("0.0.0.0", port))
