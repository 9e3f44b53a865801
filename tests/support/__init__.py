"""Helpers the tests share: which database this run uses, real processes, waiting."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENDORS = {"sqlite": "sqlite", "mysql": "mysql", "postgres": "postgresql"}
CURRENT_DB = os.environ.get("DBQUEUE_DB", "sqlite")
CURRENT_VENDOR = VENDORS[CURRENT_DB]
# DBQUEUE_QUEUE_DB=1: testproject routes the queue's tables to a second database, "queue".
SECOND_DATABASE = os.environ.get("DBQUEUE_QUEUE_DB", "") == "1"
# DBQUEUE_TEST_GALERA=1: only the tests marked galera run, against tests/support/galera.py.
GALERA = os.environ.get("DBQUEUE_TEST_GALERA", "") == "1"
# DBQUEUE_TEST_REPLICA=1: only the tests marked replica run, against tests/support/replica.py.
REPLICA = os.environ.get("DBQUEUE_TEST_REPLICA", "") == "1"
# DBQUEUE_TEST_SCALE=1: the tests marked scale run too (`nox -s scale`, on its private
# servers: tests/support/scale_servers.py); other runs leave them out.
SCALE = os.environ.get("DBQUEUE_TEST_SCALE", "") == "1"


class Processes:
    """Starts manage.py commands as real processes and makes sure none outlives the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        return self.python("manage.py", *args, env=env)

    def python(self, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        """``python *args`` (a script, or ``-m`` and a module) in the project's root."""
        proc = subprocess.Popen(
            [sys.executable, *args],
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

    def stacks(self) -> str:
        """The stacks of the processes still running (see :func:`process_stacks`)."""
        return "\n".join(process_stacks(p.pid) for p in self.started if p.poll() is None)

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren and so on, as /proc lists them now."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def process_stacks(pid: int) -> str:
    """Every thread's Python stack of ``pid`` and its descendants (``py-spy dump``, from
    the test extra), to show where a process that should have ended is."""
    spy = Path(sys.executable).with_name("py-spy")
    parts = []
    for each in [pid, *descendants(pid)]:
        try:
            done = subprocess.run(
                [str(spy), "dump", "--pid", str(each)], capture_output=True, text=True, timeout=30
            )
            parts.append(f"--- stacks of {each}\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.TimeoutExpired) as error:
            parts.append(f"--- stacks of {each}: {error!r}")
    return "\n".join(parts)


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


@contextmanager
def empty_database(connection: Any, sqlite_path: Path) -> Iterator[str]:
    """The name of a new, empty database on ``connection``'s server, dropped afterwards
    (on SQLite, a file path that does not exist yet)."""
    if connection.vendor == "sqlite":
        yield str(sqlite_path)
        return
    name = f"{connection.settings_dict['NAME']}_empty"
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")


@contextmanager
def writes_held_off(model: Any) -> Iterator[None]:
    """Other connections cannot write to ``model``'s table (on SQLite: to any table)
    until the block ends; they wait, as behind a long transaction."""
    from django.db import connections, router

    conn = connections[router.db_for_write(model)]
    table = conn.ops.quote_name(model._meta.db_table)
    with conn.cursor() as cursor:
        if conn.vendor == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")
            end = "COMMIT"
        elif conn.vendor == "mysql":
            cursor.execute(f"LOCK TABLES {table} READ")
            end = "UNLOCK TABLES"
        else:
            cursor.execute("BEGIN")
            cursor.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
            end = "COMMIT"
        try:
            yield
        finally:
            cursor.execute(end)


def reap(procs: list[subprocess.Popen[str]]) -> None:
    """Kill whichever of ``procs`` still runs and close every pipe they had."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream and not stream.closed:
                stream.close()


def grow_by_copying(rows: Any, total: int) -> None:
    """Copy the rows of the Job queryset ``rows`` (all without a unique_key) with
    INSERT ... SELECT until there are ``total``: a big table in seconds, where building
    and sending that many rows from Python takes most of a minute."""
    from django.db import connections

    from django_dbqueue.models import Job

    columns = [f.attname for f in Job._meta.concrete_fields if not f.primary_key and not f.unique]
    conn = connections[rows.db]
    into = ", ".join(conn.ops.quote_name(c) for c in columns)
    while (have := rows.count()) < total:
        copies = rows.order_by().values_list(*columns)[: total - have]
        select, params = copies.query.sql_with_params()
        with conn.cursor() as cursor:
            cursor.execute(f"INSERT INTO {Job._meta.db_table} ({into}) {select}", params)


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, once more when CPython 3.11 before 3.11.8 raises its spurious
    ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905: the
    AST builder's depth count is the interpreter's, and a finalizer or another thread
    building an AST meanwhile, as 3.11's traceback formatting does, upsets it)."""
    try:
        return ast.parse(source, filename)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source, filename)
