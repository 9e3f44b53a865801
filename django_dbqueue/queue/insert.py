"""New rows: the one-row INSERT behind ``enqueue`` and the multi-row one of ``enqueue_many``.

Neither goes through ``Model.save`` or ``bulk_create``: the statements are built once per
database connection and the values enqueue validated are bound as they are (the JSON
text it already made, the columns it does not set prepared once, and in a one-row INSERT
the nullable columns it leaves NULL not named at all).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import JSONField

from django_dbqueue.queue.dialects import Done, Rows, dialect, insert_rows

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# An unsaved job may carry, under this attribute, {column: (value, its JSON text)} for
# JSON values that were serialized already (enqueue() checked the text): the INSERT binds
# that text instead of serializing the value again.
JSON_TEXT = "_dbqueue_json_text"


class OneRowInsert:
    """The INSERT of one job on one connection, and the values of the columns enqueue
    does not set (their defaults, prepared once)."""

    def __init__(self, model: type[Job], conn: BaseDatabaseWrapper) -> None:
        self.conn = conn
        self.dialect = dialect(conn)
        # The last datetime adapted for the driver, and what it became.
        self.adapted: tuple[Any, Any] = (None, None)
        self.fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        self.names = [f.attname for f in self.fields]
        self.json = frozenset(f.attname for f in self.fields if isinstance(f, JSONField))
        self.datetimes = frozenset(
            f.attname for f in self.fields if f.get_internal_type() == "DateTimeField"
        )
        self.converted = self.json | self.datetimes
        # Defaults that are not callables (timezone.now, list, dict) are the same each
        # time; a nullable column without a default is NULL.
        self.constants = {
            f.attname: f.get_db_prep_save(f.get_default(), conn)
            for f in self.fields
            if (f.has_default() and not callable(f.default)) or (f.null and not f.has_default())
        }
        # Nullable columns whose default is NULL, as the table's own default is (Django
        # sets none): a one-row INSERT names them only when the job sets them. A new job
        # sets few, and each bound parameter costs the driver (MySQLdb escapes each in
        # Python) more than the statement's text does.
        self.optional = [
            f.attname
            for f in self.fields
            if f.null and not (f.has_default() and callable(f.default)) and f.get_default() is None
        ]
        self.qn = conn.ops.quote_name
        self.table = self.qn(model._meta.db_table)
        # (unique, notify, which optional columns are set) -> (INSERT, its columns)
        self.statements: dict[tuple[bool, bool, tuple[bool, ...]], tuple[str, list[str]]] = {}
        # The cursor kept for the next enqueue, and the driver connection it belongs to.
        self._kept: tuple[CursorWrapper, Any] | None = None

    def kept_cursor(self) -> CursorWrapper | None:
        """A cursor of the connection's, kept from one enqueue to the next: Django makes a
        new one for every statement, which cost psycopg 50 µs, a tenth of an enqueue. It
        still runs Django's execute (wrappers, the broken-transaction check, the error
        mapping). None where Django's own way does more, and the caller makes a new one
        (:meth:`Dialect.one_row_cursor`) and closes it after: while queries are logged
        (DEBUG, CaptureQueriesContext) and before a health check that is due
        (CONN_HEALTH_CHECKS). A kept cursor of an older driver connection is dropped."""
        conn = self.conn
        if conn.queries_logged or (
            getattr(conn, "health_check_enabled", False)
            and not getattr(conn, "health_check_done", True)
        ):
            self._kept = None
            return None
        kept = self._kept
        if kept is None or kept[1] is not conn.connection or conn.connection is None:
            self._kept = None  # one of an older connection: dropped (closing may raise)
            kept = self._kept = (self.dialect.one_row_cursor(conn), conn.connection)
        return kept[0]

    def _statement(
        self, unique: bool, notify: bool, present: tuple[bool, ...]
    ) -> tuple[str, list[str]]:
        left_out = {name for name, set_ in zip(self.optional, present, strict=True) if not set_}
        names = [name for name in self.names if name not in left_out]
        # JSON is bound as its text (enqueue has the text already).
        json_value = self.dialect.json_placeholder
        values = ", ".join(json_value if n in self.json else "%s" for n in names)
        columns = ", ".join(self.qn(n) for n in names)
        sql = self.dialect.insert_one_sql(self.conn, self.table, columns, values, unique, notify)
        return sql, names

    def one_row(
        self, values: Mapping[str, Any], json_text: Mapping[str, str], unique: bool, notify: bool
    ) -> tuple[str, list[Any]]:
        """The INSERT of one job and its parameters (see :meth:`params`), naming only
        the optional columns the job sets."""
        present = tuple([values.get(name) is not None for name in self.optional])
        key = (unique, notify, present)
        statement = self.statements.get(key)
        if statement is None:
            statement = self.statements[key] = self._statement(unique, notify, present)
        sql, names = statement
        return sql, self.params(values, json_text, names)

    def params(
        self,
        values: Mapping[str, Any],
        json_text: Mapping[str, str],
        names: list[str] | None = None,
    ) -> list[Any]:
        """The row's parameters for ``names`` (default: every column): ``values`` by
        column name (JSON columns by their text in ``json_text`` where given), every
        other column its default."""
        params: list[Any] = []
        for name in self.names if names is None else names:
            if name in json_text:
                params.append(json_text[name])
            elif name in values:
                value = values[name]
                # Most columns go as they are: no call for them (enqueue's hot path).
                params.append(self.prepare(name, value) if name in self.converted else value)
            elif name in self.constants:
                params.append(self.constants[name])
            else:
                raise ValueError(f"no value for the job column {name!r}")
        return params

    def prepare(self, name: str, value: Any) -> Any:
        """A column's value as the driver takes it: JSON as text, datetimes adapted."""
        if name in self.json:
            if value is None:
                return None
            if not value and type(value) in (list, dict):
                return "[]" if type(value) is list else "{}"
            return json.dumps(value)
        if value is not None and name in self.datetimes:
            return self.adapt_datetime(value)
        return value

    def adapt_datetime(self, value: Any) -> Any:
        # run_after and created_at: one "now" for many jobs, adapted once.
        adapted = self.adapted
        if adapted[0] is not value:
            adapted = self.adapted = (value, self.conn.ops.adapt_datetimefield_value(value))
        return adapted[1]


def _plan(model: type[Job], conn: BaseDatabaseWrapper) -> OneRowInsert:
    # Kept on the connection (one per thread): built on its first enqueue.
    plan: OneRowInsert | None = getattr(conn, "_dbqueue_one_row_insert", None)
    if plan is None:
        plan = OneRowInsert(model, conn)
        conn._dbqueue_one_row_insert = plan  # type: ignore[attr-defined]
    return plan


def insert_one(
    model: type[Job],
    conn: BaseDatabaseWrapper,
    values: Mapping[str, Any],
    json_text: Mapping[str, str],
    unique: bool,
    notify: tuple[str, str] | None,
) -> int | None:
    """INSERT one job row in one statement; returns its id.

    ``unique``: a row whose ``unique_key`` is taken is not inserted, and None is returned
    (PostgreSQL and SQLite: ``ON CONFLICT DO NOTHING``; MySQL/MariaDB: its IntegrityError,
    which rolls back that statement only, is caught). ``notify`` (PostgreSQL): the
    (channel, payload) of a ``pg_notify`` made by the same statement for an inserted row, so it is
    delivered when the transaction commits and dropped if it rolls back.
    """
    plan = _plan(model, conn)
    sql, params = plan.one_row(values, json_text, unique, notify is not None)
    if notify is not None:
        params += notify
    cursor = plan.kept_cursor()  # a plain call, not a with block: this is enqueue's hot path
    if cursor is not None:
        return plan.dialect.insert_one(cursor, sql, params, unique)
    with plan.dialect.one_row_cursor(conn) as cursor:
        return plan.dialect.insert_one(cursor, sql, params, unique)


def json_text(job: Job) -> dict[str, str]:
    """The JSON text enqueue made of the job's JSON values (args, kwargs), for those
    still holding the very object it was made of."""
    made: dict[str, tuple[Any, str]] | None = job.__dict__.get(JSON_TEXT)
    if not made:
        return {}
    attrs = job.__dict__
    return {name: text for name, (value, text) in made.items() if attrs.get(name) is value}


def insert_columns(
    model: type[Job],
    using: str,
    batches: Iterable[tuple[int, Mapping[str, Any], Mapping[str, list[Any]]]],
    done: Done | None = None,
) -> list[int] | None:
    """INSERT job rows, one multi-row statement per batch of ``(count, values,
    per_row)``; the new ids, in order, where the database says them (MariaDB,
    PostgreSQL and SQLite; not MySQL: None).

    ``values``: a column's value in every row of the batch; ``per_row``: a column's
    ``count`` values. Both as a Job's attributes hold them, except that a JSON column of
    ``per_row`` is given as its JSON text. Every other column takes its default.
    ``done(start, stop, ids)`` and when ``batches`` is read: :func:`.dialects.insert_rows`.
    """
    conn = connections[using]
    plan = _plan(model, conn)

    def prepared() -> Iterator[Rows]:
        offset = 0
        for count, values, per_row in batches:
            ready = {name: plan.prepare(name, value) for name, value in values.items()}
            rows = dict(per_row)
            for name in plan.datetimes.intersection(rows):
                rows[name] = [None if v is None else plan.adapt_datetime(v) for v in rows[name]]
            yield _rows(plan, count, ready, rows, offset)
            offset += count

    return insert_rows(conn, plan.table, plan.fields, prepared(), done)


def _rows(
    plan: OneRowInsert,
    count: int,
    values: Mapping[str, Any],
    per_row: Mapping[str, list[Any]],
    offset: int,
) -> Rows:
    """The prepared values of ``count`` rows as :class:`.dialects.Rows`; a column whose
    values are all equal is bound once per statement."""
    columns: list[Any] = []
    varying: list[bool] = []
    for name in plan.names:
        column = per_row.get(name)
        if column is not None:
            if len(column) != count:
                raise ValueError(f"{len(column)} values for the job column {name!r}, not {count}")
            varies = column.count(column[0]) != count
            columns.append(column if varies else column[0])
            varying.append(varies)
            continue
        if name in values:
            columns.append(values[name])
        elif name in plan.constants:
            columns.append(plan.constants[name])
        else:
            raise ValueError(f"no value for the job column {name!r}")
        varying.append(False)
    return Rows(columns, varying, count, offset)


def insert_many(model: type[Job], using: str, jobs: Sequence[Job], batch_size: int) -> list[Job]:
    """INSERT jobs (unsaved Job objects) in multi-row statements; sets their ids where
    the database says them. What ``bulk_create`` does, minus its per-value overhead (see
    :func:`insert_columns`): MySQL does not return the new ids, and there the jobs keep
    ``id = None``, as with ``bulk_create``.
    """
    if not jobs:
        return []
    conn = connections[using]
    plan = _plan(model, conn)
    rows = [plan.params(job.__dict__, json_text(job)) for job in jobs]
    columns = zip(*rows, strict=True)
    per_row = {name: list(column) for name, column in zip(plan.names, columns, strict=True)}
    batches = [
        _rows(
            plan,
            len(rows[start : start + batch_size]),
            {},
            {name: column[start : start + batch_size] for name, column in per_row.items()},
            start,
        )
        for start in range(0, len(rows), batch_size)
    ]
    new_ids = insert_rows(conn, plan.table, plan.fields, batches)
    if new_ids is not None:
        for job, new_id in zip(jobs, new_ids, strict=True):
            job.id = new_id
            job._state.adding, job._state.db = False, using
    for job in jobs:
        job.__dict__.pop(JSON_TEXT, None)
    return list(jobs)
