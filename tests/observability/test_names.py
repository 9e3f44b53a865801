"""Every metric and span name the code emits is listed in docs/observability.md, and
every name listed there is one the code emits."""

from __future__ import annotations

import ast
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue.observability import metrics, tracing
from tests.support import ROOT, parse_source

pytestmark = pytest.mark.only_vendor("sqlite")  # the code and docs are the same everywhere

DOCS = (ROOT / "docs" / "observability.md").read_text()
ROOM = ROOT / "django_dbqueue" / "observability"
METRIC = re.compile(r"dbqueue_[a-z_]+")


def documented_metrics() -> set[str]:
    """The first column of the metric tables: | `dbqueue_...` | type | ..."""
    return set(re.findall(r"^\| `(dbqueue_[a-z_]+)` \| (?:counter|gauge|histogram) \|", DOCS, re.M))


def documented_worker_metrics() -> set[str]:
    section = DOCS.split("## Worker metrics", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(dbqueue_[a-z_]+)` \|", section, re.M))


def metric_names_in_code() -> set[str]:
    """Every string constant of the observability room that is a metric name."""
    found: set[str] = set()
    for path in ROOM.glob("*.py"):
        for node in ast.walk(parse_source(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if METRIC.fullmatch(node.value):
                    found.add(node.value)
    return found


def test_metric_names_in_the_code_are_the_documented_ones() -> None:
    assert metric_names_in_code() == documented_metrics()


def test_metric_names_follow_the_prometheus_conventions() -> None:
    for name in documented_metrics():
        row = re.search(rf"^\| `{name}` \| (\w+) \|", DOCS, re.M)
        assert row is not None
        kind = row[1]
        assert (kind == "counter") == name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name


def test_span_names_and_attributes_are_documented() -> None:
    [row] = re.findall(r"^\| `<queue>(.*?)` .*\| CONSUMER \|.*$", DOCS, re.M)
    assert row == tracing.SPAN_SUFFIX
    table_row = next(line for line in DOCS.splitlines() if "| CONSUMER |" in line)
    source = (ROOM / "tracing.py").read_text()
    attributes = set(re.findall(r'^\s+"((?:messaging|dbqueue)\.[a-z_.]+)":', source, re.M))
    assert attributes, "the attributes are where this test reads them"
    assert {a for a in attributes if f"`{a}`" not in table_row} == set()
    assert f"`{tracing.MESSAGING_SYSTEM}`" in table_row


def test_a_scrape_skips_a_metrics_file_a_process_is_creating() -> None:
    """A child started in place of a killed one creates its files while a scrape reads
    the directory: an empty one failed the scrape with HTTP 500."""
    server = metrics.Server(0, "127.0.0.1")
    try:
        server.metrics.claims.inc()
        pid = os.getpid() + 1_000_000  # no such process
        for name in (f"counter_{pid}.db", f"gauge_livesum_{pid}.db"):
            (Path(server.directory) / name).touch()
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert "dbqueue_claims_total 1.0" in text


def test_a_scrape_shows_only_documented_names(tmp_path: Any) -> None:
    """The worker metrics' server, in this process: every metric observed once, then
    scraped (the process tests compare what they scrape the same way)."""
    server = metrics.Server(0, "127.0.0.1")
    try:
        worker = server.metrics
        worker.finished.labels("default", "t", "done").inc()
        worker.run_seconds.labels("default", "t").observe(0.1)
        worker.wait_seconds.labels("default", "t").observe(0.1)
        worker.running.labels("default").inc()
        worker.claims.inc()
        worker.empty_claims.inc()
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    exposed = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(text)
    }
    assert exposed == documented_worker_metrics()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
