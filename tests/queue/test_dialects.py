"""The vendor differences of the queue live in ``queue/dialects/``: nothing else asks
which database it runs on, and each database has one dialect object per connection."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.enqueueing import build_job
from django_dbqueue.models import Job
from django_dbqueue.queue.dialects import Dialect, dialect, estimated_rows, key_position
from django_dbqueue.queue.dialects.choice import BY_VENDOR
from django_dbqueue.queue.insert import OneRowInsert
from tests.support import ROOT, jobs, parse_source

PACKAGE = ROOT / "django_dbqueue"

# Where reading ``.vendor`` is the point. Each entry says why.
ALLOWED = (
    "queue/dialects/",  # the queue's vendor differences, all of them
    "locks/",  # one lock backend per database by design
    "checks.py",  # checks that the lock backend fits its database: the locks' concern
    "migrations/",  # schema per database (partial and virtual-column indexes)
    # The benchmark measures each database against a driver-only yardstick of its own.
    "bench/",
)


def vendor_reads(path: Path) -> list[int]:
    """The lines of ``path`` that read an attribute named ``vendor``."""
    tree = parse_source(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "vendor"
    ]


@pytest.mark.only_vendor("sqlite")  # the code's shape is the same on every database
def test_no_module_outside_the_dialects_reads_the_database_vendor() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith(ALLOWED):
            continue
        found += [f"django_dbqueue/{name}:{line}" for line in vendor_reads(path)]
    assert found == []


@pytest.mark.only_vendor("sqlite")
def test_the_scan_sees_a_vendor_read(tmp_path: Path) -> None:
    module = tmp_path / "branchy.py"
    module.write_text(
        "def f(conn, connections):\n"
        "    if conn.vendor == 'mysql':\n"
        "        return connections['default'].vendor\n"
    )
    assert vendor_reads(module) == [2, 3]


@pytest.mark.only_vendor("sqlite")
def test_every_dialect_method_is_part_of_the_interface() -> None:
    """A database's dialect overrides the interface; it adds nothing the queue would
    have to ask for by vendor."""
    interface = {name for name in vars(Dialect) if not name.startswith("_")}
    for chosen in BY_VENDOR.values():
        for cls in type(chosen).__mro__:
            if cls is Dialect or cls is object:
                break
            extra = {name for name in vars(cls) if not name.startswith("_")} - interface
            assert extra == set(), (cls.__name__, extra)


def test_the_connection_speaks_its_own_dialect_chosen_once() -> None:
    chosen = dialect(connection)
    assert chosen.vendor == connection.vendor
    assert dialect(connection) is chosen
    assert isinstance(chosen, BY_VENDOR[connection.vendor].__class__)


# What every dialect must do on its own database (as River's driver conformance suite):
# the same answers whatever SQL it writes.


def _ids(sql: str, params: list[Any]) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {int(row[0]) for row in cursor.fetchall()}


@pytest.mark.django_db
def test_ids_in_and_by_id_only_select_exactly_those_rows() -> None:
    made = [enqueue(jobs.noop).pk for _ in range(5)]
    Job.objects.filter(pk=made[1]).update(status="done")
    speaks = dialect(connection)
    qn = connection.ops.quote_name
    where, params = speaks.ids_in(connection, qn("id"), [made[0], made[1], made[3], 10**9])
    sql = f"SELECT {qn('id')} FROM dbqueue_job WHERE {where}"  # noqa: S608
    assert _ids(sql, params) == {
        made[0],
        made[1],
        made[3],
    }
    queued = speaks.by_id_only(f"{qn('status')} = %s")
    sql = f"SELECT {qn('id')} FROM dbqueue_job WHERE {where} AND {queued}"  # noqa: S608
    assert _ids(sql, [*params, "queued"]) == {made[0], made[3]}


@pytest.mark.django_db
def test_keyed_rows_say_which_key_each_row_matched() -> None:
    for key in ["a", "b", "c", "c"]:
        enqueue(jobs.noop, concurrency_key=key)
    keys = ["c", "a"]
    speaks = dialect(connection)
    rows, label, params = speaks.keyed_rows(connection, "dbqueue_job", keys, "dbq_job_concurrency")
    with connection.cursor() as cursor:
        sql = f"SELECT {label}, COUNT(*) FROM {rows} GROUP BY {label}"  # noqa: S608
        cursor.execute(sql, params)
        found = cursor.fetchall()
    position = key_position(keys)
    assert {keys[position[label_value]]: count for label_value, count in found} == {
        "c": 2,
        "a": 1,
    }


@pytest.mark.django_db(transaction=True)
def test_a_unique_insert_that_collides_is_none_and_the_transaction_goes_on() -> None:
    speaks = dialect(connection)
    plan = OneRowInsert(Job, connection)

    def insert(key: str) -> int | None:
        job = build_job(jobs.noop, None, None, unique_key=key)
        sql, params = plan.one_row(job.__dict__, {}, unique=True, notify=False)
        with connection.cursor() as cursor:
            return speaks.insert_one(cursor, sql, params, unique=True)

    with transaction.atomic():
        first, again, other = insert("k"), insert("k"), insert("other")
    assert first is not None and other is not None and again is None
    assert sorted(Job.objects.values_list("unique_key", flat=True)) == ["k", "other"]


@pytest.mark.django_db
def test_finished_with_reads_the_finished_jobs_of_that_status_only() -> None:
    done, failed, queued = (enqueue(jobs.noop).pk for _ in range(3))
    Job.objects.filter(pk=done).update(status="done", finished_at=timezone.now())
    Job.objects.filter(pk=failed).update(status="failed", finished_at=timezone.now())
    assert list(Job.objects.finished_with("done").values_list("pk", flat=True)) == [done]
    assert queued not in Job.objects.finished_with("queued").values_list("pk", flat=True)


@pytest.mark.django_db
def test_the_row_estimate_is_a_count_or_nothing() -> None:
    estimate = estimated_rows(connection.alias, "dbqueue_job")
    assert estimate is None or estimate >= 0


@pytest.mark.only_vendor("mysql")
@pytest.mark.parametrize(
    ("use_tz", "zone", "as_micros"),
    [(True, None, True), (True, "UTC", True), (True, "Europe/Paris", False), (False, None, False)],
)
def test_the_finish_sends_times_as_microseconds_only_where_the_connection_stores_utc(
    settings: Any, use_tz: bool, zone: str | None, as_micros: bool
) -> None:
    """Microseconds since the epoch are UTC: another storage zone gets Django's own text."""
    from django_dbqueue.queue.dialects.mysql import _time_codec

    settings.USE_TZ = use_tz
    conn = connection
    saved = conn.settings_dict.get("TIME_ZONE")
    conn.settings_dict["TIME_ZONE"] = zone
    try:
        _, kind, value = _time_codec(conn)
    finally:
        conn.settings_dict["TIME_ZONE"] = saved
    assert (kind == "BIGINT") is as_micros
    assert ("TIMESTAMPADD" in value("f.x")) is as_micros


@pytest.mark.django_db
@pytest.mark.only_vendor("postgresql")
@pytest.mark.parametrize("use_tz", [True, False], ids=["aware", "naive"])
def test_claims_read_timestamptz_with_psycopgs_own_loader_where_the_connection_is_utc(
    settings: Any, use_tz: bool
) -> None:
    """Django has psycopg parse ``timestamptz`` in Python (a subclass of psycopg's Python
    loader); a claim's cursor takes psycopg's own (C) loader where the result is the
    same, aware in UTC, and keeps Django's for naive datetimes."""
    import psycopg
    from psycopg.pq import Format

    settings.USE_TZ = use_tz
    oid = psycopg.adapters.types["timestamptz"].oid
    with connection.cursor() as cursor:
        djangos = cursor.cursor.adapters.get_loader(oid, Format.TEXT)
        dialect(connection).prepare_reading(connection, cursor)
        loader = cursor.cursor.adapters.get_loader(oid, Format.TEXT)
        cursor.execute("SELECT TIMESTAMPTZ '2026-11-27 08:45:12.123456+00'")
        [(read,)] = cursor.fetchall()
    own = psycopg.adapters.get_loader(oid, Format.TEXT)
    assert djangos is not own
    if use_tz:
        assert loader is own
        assert read == datetime(2026, 11, 27, 8, 45, 12, 123456, tzinfo=UTC)
        assert read.tzinfo is UTC
    else:
        assert loader is djangos
    with connection.cursor() as cursor:  # the connection's other cursors keep Django's
        assert cursor.cursor.adapters.get_loader(oid, Format.TEXT) is not own
