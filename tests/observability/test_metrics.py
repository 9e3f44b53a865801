"""Prometheus metrics scraped over real HTTP while a drain runs: the workers' (run_jobs
--metrics-port, one scrape for the whole host) and the cluster's (the Django view)."""

from __future__ import annotations

import glob
import os
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
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
    except (urllib.error.URLError, ConnectionError):
        return None


DONE, FAILING, RETRIED = 400, 3, 2
TASK_RECORD = "tests.support.jobs.record"
TASK_FAIL = "tests.support.jobs.fail"


@pytest.mark.processes
def test_worker_metrics_count_the_jobs_of_every_process(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many({"task": jobs.record, "args": [f"job-{i}"]} for i in range(DONE))
    enqueue_many([{"task": jobs.fail, "max_attempts": 1}] * FAILING)
    enqueue_many([{"task": jobs.fail, "max_attempts": 2, "retry_backoff": 0}] * RETRIED)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    runs = os.path.join(tempfile.gettempdir(), "dbqueue-metrics-*")
    before = set(glob.glob(runs))
    worker = processes.run_jobs(
        "--concurrency", "2", "--threads", "2", "--metrics-port", str(port), env=worker_env()
    )
    # Scraped while the drain runs: the exposition parses, whatever the moment.
    first = wait_until(lambda: scrape_or_none(url), timeout=60)
    assert first is not None
    finished = DONE + FAILING + RETRIED
    wait_until(
        lambda: Job.objects.filter(status__in=["done", "failed"]).count() == finished,
        timeout=180,
    )

    def counted() -> Samples | None:
        samples, _ = scrape(url)
        done = total(samples, "dbqueue_jobs_finished_total", outcome="done")
        return samples if done == DONE else None

    wait_until(counted, timeout=30)
    # A job that kills its process, once the rest are counted: a child killed loses
    # what it counted since its last flush, up to a second (docs/observability.md).
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
    # Every attempt that ended was timed; the dead one's time was never observed.
    attempts = DONE + FAILING + 2 * RETRIED
    assert total(samples, "dbqueue_job_run_seconds_count") == attempts
    assert total(samples, "dbqueue_job_run_seconds_count", queue="default") == attempts
    # The dead job's start was tallied by a process that died before writing it (unless
    # its flush came in the microseconds between).
    assert attempts <= total(samples, "dbqueue_job_wait_seconds_count") <= attempts + 1
    assert total(samples, "dbqueue_claims_total") >= 1
    assert total(samples, "dbqueue_empty_claims_total") >= 1
    # The child that died took its "running" with it; the rest have finished.
    wait_until(lambda: total(scrape(url)[0], "dbqueue_jobs_running") == 0, timeout=30)
    worker.terminate()
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert scrape_or_none(url) is None  # the server went with the run
    # And so did its directory (other runs' directories may come and go meanwhile).
    assert set(glob.glob(runs)) - before == set()


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
