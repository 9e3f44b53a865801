from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
VENDORS = {"sqlite": "sqlite", "mysql": "mysql", "postgres": "postgresql"}
CURRENT_DB = os.environ.get("DBQUEUE_DB", "sqlite")
CURRENT_VENDOR = VENDORS[CURRENT_DB]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (not skip) tests marked ``only_vendor(...)`` for another database run."""
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("only_vendor")
        wanted = set(marker.args) if marker is not None else set()
        (keep if marker is None or wanted & {CURRENT_VENDOR, CURRENT_DB} else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def vendor() -> str:
    return connection.vendor


@pytest.fixture
def worker_env(transactional_db: None) -> Callable[..., dict[str, str]]:
    """Environment for a child process that must use this test run's database."""

    def make(**dbqueue_settings: Any) -> dict[str, str]:
        env = dict(os.environ)
        env["DBQUEUE_DB"] = os.environ.get("DBQUEUE_DB", "sqlite")
        env["DBQUEUE_DB_NAME"] = str(connection.settings_dict["NAME"])
        env["DBQUEUE_SETTINGS_JSON"] = json.dumps(dbqueue_settings)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    return make


class Processes:
    """Starts manage.py commands as real processes and makes sure none outlives the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.started.append(proc)
        return proc

    def run_jobs(self, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        return self.start("run_jobs", *args, env=env)

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    yield procs
    procs.kill_all()


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
