"""Prometheus metrics scraped over real HTTP while a drain runs: the workers' (run_jobs
--metrics-port, one scrape for the whole host) and the cluster's (the Django view)."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.observability.cluster import cache
from tests.observability.test_names import documented_metrics, documented_worker_metrics
from tests.support import Processes, jobs, wait_until
from tests.worker import hostile

pytestmark = pytest.mark.django_db(transaction=True)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str, token: str | None = None) -> tuple[Samples, set[str]]:
    """{(sample name, labels): value} and the exposed names (counters with _total)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name + ("_total" if family.type == "counter" else ""))
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, names


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


def scrape_or_none(url: str) -> tuple[Samples, set[str]] | None:
    try:
        return scrape(url)
    except OSError:  # refused, reset, timed out (URLError is one too)
        return None


def listens(pid: int, port: int) -> bool:
    """Does process ``pid`` hold the socket listening on ``port`` (Linux's /proc)?"""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    sockets.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                return True
        except FileNotFoundError:
            continue
    return False


def run_jobs_serving_metrics(
    processes: Processes, env: dict[str, str], *args: str
) -> tuple[subprocess.Popen[str], str]:
    """run_jobs with --metrics-port on a free port, once it is listening there; and the
    URL. A port found free may be taken by another process before run_jobs binds it
    (tests of other checkouts run beside these): run_jobs then exits at once, and another
    port is tried. Scrapes go to our worker only: the socket must be the supervisor's."""
    for _ in range(5):
        port = free_port()
        worker = processes.run_jobs(*args, "--metrics-port", str(port), env=env)

        def up(worker: subprocess.Popen[str] = worker, port: int = port) -> bool:
            return worker.poll() is not None or listens(worker.pid, port)

        wait_until(up, timeout=60)
        if worker.poll() is None:
            return worker, f"http://127.0.0.1:{port}/metrics"
        out, _ = worker.communicate(timeout=30)
        assert "Cannot serve metrics on port" in out, out
    raise AssertionError("no free port for the metrics in 5 tries")


DONE, FAILING, RETRIED = 400, 3, 2
TASK_RECORD = "tests.support.jobs.record"
RUNNING = "dbqueue_jobs_running"
TASK_FAIL = "tests.support.jobs.fail"


@pytest.mark.processes
def test_worker_metrics_count_the_jobs_of_every_process(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many({"task": jobs.record, "args": [f"job-{i}"]} for i in range(DONE))
    enqueue_many([{"task": jobs.fail, "max_attempts": 1}] * FAILING)
    enqueue_many([{"task": jobs.fail, "max_attempts": 2, "retry_backoff": 0}] * RETRIED)
    worker, url = run_jobs_serving_metrics(
        processes, worker_env(), "--concurrency", "2", "--threads", "2"
    )
    # This run's directory: the one with the supervisor's own files (other runs, of
    # other checkouts' tests or a benchmark, make and remove theirs meanwhile).
    runs = os.path.join(tempfile.gettempdir(), "dbqueue-metrics-*", f"*_{worker.pid}.db")
    ours = {os.path.dirname(name) for name in glob.glob(runs)}
    assert len(ours) == 1, ours
    # Scraped while the drain runs: the exposition parses, whatever the moment.
    first = wait_until(lambda: scrape_or_none(url), timeout=60)
    assert first is not None
    finished = DONE + FAILING + RETRIED
    wait_until(
        lambda: Job.objects.filter(status__in=["done", "failed"]).count() == finished,
        timeout=180,
    )
    attempts = DONE + FAILING + 2 * RETRIED

    def counted() -> bool:
        samples = (scrape_or_none(url) or ({}, set()))[0]
        return (
            total(samples, "dbqueue_jobs_finished_total", outcome="done") == DONE
            and total(samples, "dbqueue_jobs_finished_total", outcome="failed") == FAILING + RETRIED
            and total(samples, "dbqueue_jobs_finished_total", outcome="retried") == RETRIED
            and total(samples, "dbqueue_job_run_seconds_count") == attempts
        )

    # A job that kills its process, once every count is flushed (done, failed, retried
    # and the timings: any child may take the killer): a child killed loses what it
    # counted since its last flush, up to a second (docs/observability.md).
    wait_until(counted, timeout=30)
    enqueue_many([{"task": hostile.exit_hard, "max_attempts": 1}])
    wait_until(
        lambda: Job.objects.filter(status__in=["done", "failed"]).count() == finished + 1,
        timeout=60,
    )
    samples = wait_until(
        lambda: (
            (found := scrape(url)[0])
            and total(found, "dbqueue_jobs_finished_total", outcome="died") == 1
            and found
        ),
        timeout=30,
    )
    assert scrape(url)[1] == documented_worker_metrics()
    outcome = "dbqueue_jobs_finished_total"
    assert total(samples, outcome, outcome="done", task=TASK_RECORD) == DONE
    assert total(samples, outcome, outcome="failed", task=TASK_FAIL) == FAILING + RETRIED
    assert total(samples, outcome, outcome="retried", task=TASK_FAIL) == RETRIED
    assert total(samples, outcome, outcome="died") == 1
    assert total(samples, outcome) == DONE + FAILING + 2 * RETRIED + 1
    # Every attempt that ended was timed (its run and its wait, observed at its end);
    # the dead one's never ended.
    assert total(samples, "dbqueue_job_run_seconds_count") == attempts
    assert total(samples, "dbqueue_job_run_seconds_count", queue="default") == attempts
    assert total(samples, "dbqueue_job_wait_seconds_count") == attempts
    assert total(samples, "dbqueue_claims_total") >= 1
    assert total(samples, "dbqueue_empty_claims_total") >= 1
    # The child that died took its "running" with it; the rest have finished.
    wait_until(lambda: total(scrape(url)[0], "dbqueue_jobs_running") == 0, timeout=30)
    worker.terminate()
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert scrape_or_none(url) is None  # the server went with the run
    # And so did its directory.
    assert not os.path.exists(ours.pop())


@pytest.mark.processes
def test_running_jobs_are_shown_for_each_executor(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    """The running gauge is what the executors run at the flush: jobs in the main thread
    (inline), in threads, and on the event loop; at 0 once they end."""
    # One queue each (the project's three): main thread, threads, event loop.
    wanted = {"default": 1, "emails": 2, "reports": 2}
    enqueue_many([{"task": jobs.sleep, "args": [60], "queue": "default"}])
    enqueue_many([{"task": jobs.sleep, "args": [60], "queue": "emails"}] * 2)
    enqueue_many([{"task": jobs.async_sleep, "args": [60], "queue": "reports"}] * 2)
    env = worker_env(**QUICK_CANCELS)
    served = [
        run_jobs_serving_metrics(processes, env, "--queue", "default"),
        run_jobs_serving_metrics(processes, env, "--queue", "emails", "--threads", "2"),
        run_jobs_serving_metrics(processes, env, "--queue", "reports", "--async-concurrency", "2"),
    ]
    for (_, url), (queue, count) in zip(served, wanted.items(), strict=True):
        shown = {"queue": queue}
        wait_until(lambda u=url, q=shown, c=count: total(scrape(u)[0], RUNNING, **q) == c)
        assert total(scrape(url)[0], RUNNING) == count  # none shown in another queue
    assert Job.objects.all().cancel() == (0, 5)
    for worker, url in served:
        wait_until(lambda u=url: total(scrape(u)[0], RUNNING) == 0, timeout=60)
        worker.terminate()
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0, out


# Beats the keeper's notice of a cancel; CLAIM_AHEAD 0: one claim takes the whole batch.
QUICK_CANCELS = {
    "LEASE_TIMEOUT": 600,
    "HEARTBEAT_INTERVAL": 0.3,
    "POLL_INTERVAL": 0.2,
    "CLAIM_AHEAD": 0,
    "KILL_GRACE": 1,
}
TASK_SLEEP = "tests.support.jobs.sleep"
TASK_ADD = "tests.support.jobs.add"
TASK_STUCK = "tests.worker.hostile.stuck_in_c"


def running_now(job: Job) -> bool:
    return WorkerProcess.objects.filter(running_job_id=job.pk).exists()


@pytest.mark.processes
def test_cancels_are_counted_before_the_start_while_running_and_by_a_kill(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    running = enqueue(jobs.sleep, [60])
    held = enqueue(jobs.add, [1, 1])  # claimed with it, waiting its turn
    worker, url = run_jobs_serving_metrics(
        processes, worker_env(**QUICK_CANCELS), "--batch-size", "10"
    )
    wait_until(lambda: running_now(running), timeout=60)
    assert Job.objects.get(pk=held.pk).status == Job.Status.CLAIMED
    wait_until(lambda: total(scrape(url)[0], RUNNING, queue="default") == 1)
    # One cancel for both: the keeper marks both in the slot, then interrupts the
    # running one, so the held one is found cancelled when its turn comes.
    assert Job.objects.filter(pk__in=[running.pk, held.pk]).cancel() == (0, 2)
    outcomes = "dbqueue_jobs_finished_total"
    wait_until(lambda: total(scrape(url)[0], outcomes, outcome="cancelled") == 2, timeout=60)
    # Written by the child (it is about to be killed): now one that ignores its cancel.
    stuck = enqueue(hostile.stuck_in_c)
    wait_until(lambda: running_now(stuck), timeout=60)
    assert Job.objects.filter(pk=stuck.pk).cancel() == (0, 1)
    samples = wait_until(
        lambda: (
            (found := scrape(url)[0]) and total(found, outcomes, outcome="cancelled") == 3 and found
        ),
        timeout=60,
    )
    statuses = set(Job.objects.values_list("status", flat=True))
    assert statuses == {Job.Status.CANCELLED}
    assert "killed its worker process" in Job.objects.get(pk=stuck.pk).last_error
    for task in (TASK_SLEEP, TASK_ADD, TASK_STUCK):
        assert total(samples, outcomes, outcome="cancelled", task=task) == 1, task
    assert total(samples, outcomes) == 3, "no other outcome, and no cancel counted twice"
    # Timed: the attempt that ran and was interrupted; not the one that never started,
    # nor the one whose process was killed under it.
    assert total(samples, "dbqueue_job_run_seconds_count", task=TASK_SLEEP) == 1
    assert total(samples, "dbqueue_job_run_seconds_count") == 1
    worker.terminate()
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out


def test_cluster_metrics_view(live_server: Any, settings: Any) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "METRICS_TOKEN": "s3cret"}
    cache.clear()
    enqueue_many({"task": jobs.add, "args": [i, i]} for i in range(5))
    url = f"{live_server.url}/metrics/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(url)
    assert refused.value.code == 401
    with pytest.raises(urllib.error.HTTPError):
        scrape(url, token="wrong")
    samples, _ = scrape(url, token="s3cret")
    assert total(samples, "dbqueue_queue_jobs", queue="default", status="queued") == 5
    assert total(samples, "dbqueue_queue_paused", queue="default") == 0
    assert total(samples, "dbqueue_queue_lag_seconds", queue="default") >= 0
    # Cached: five more jobs are not seen until the cache is cleared (or expires).
    enqueue_many({"task": jobs.add, "args": [i, i]} for i in range(5))
    again, _ = scrape(url, token="s3cret")
    assert total(again, "dbqueue_queue_jobs", queue="default", status="queued") == 5
    cache.clear()
    fresh, _ = scrape(url, token="s3cret")
    assert total(fresh, "dbqueue_queue_jobs", queue="default", status="queued") == 10


@pytest.mark.processes
def test_cluster_metrics_during_a_drain(
    live_server: Any,
    settings: Any,
    processes: Processes,
    worker_env: Callable[..., dict[str, str]],
) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "METRICS_CACHE_SECONDS": 0}
    count = 300
    enqueue_many({"task": jobs.record, "args": [f"c-{i}"]} for i in range(count))
    url = f"{live_server.url}/metrics/"
    worker = processes.run_jobs("--concurrency", "2", env=worker_env())

    def seen() -> Samples | None:
        samples, _ = scrape(url)
        live = total(samples, "dbqueue_worker_processes", role="child")
        return samples if live == 2 else None

    during = wait_until(seen, timeout=60)
    assert total(during, "dbqueue_worker_processes", role="supervisor") == 1
    wait_until(
        lambda: (
            total(scrape(url)[0], "dbqueue_queue_jobs", queue="default", status="done") == count
        ),
        timeout=180,
    )
    after, names = scrape(url)
    assert names == documented_metrics() - documented_worker_metrics()
    assert total(after, "dbqueue_queue_jobs", queue="default", status="queued") == 0
    assert total(after, "dbqueue_queue_lag_seconds", queue="default") == 0
    worker.terminate()
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
