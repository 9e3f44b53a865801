"""Job objects from rows read by hand: the claim's column list and per-column converters,
worked out once per connection, and a Job built without ``Model.__init__``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from django.conf import settings as django_settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField
from django.db.models.base import ModelState

from django_dbqueue.queue.dialects import dialect

if TYPE_CHECKING:
    from django_dbqueue.models import Job


class RowReader(NamedTuple):
    columns: str  # quoted column list for the SELECT
    names: list[str]  # attribute names, in the same order
    # (index, column expression, converters) of each column that has converters
    converters: list[tuple[int, Any, list[Any]]]


_READERS: dict[tuple[type[Any], str, bool], RowReader] = {}

# Columns a claim does not read: a claimed job's owner and lease are what the claim
# writes, its result, end and error text what the run writes. Left out of the instance,
# they are deferred fields: read from the database if something asks. (started_at is
# read: whether it is NULL tells a first attempt from a later one, Job.note_attempt.)
NOT_READ = frozenset(
    {
        "owner",
        "owner_date",
        "finished_at",
        "result",
        "last_error",
        "origin_unique_key",
    }
)


def _json_loads(value: Any, expression: Any, connection: Any) -> Any:
    """JSONField.from_db_value for a whole column (no key transform, no custom decoder)."""
    if value == "[]":
        return []
    if value == "{}":
        return {}
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def row_reader(model: type[Job], conn: BaseDatabaseWrapper) -> RowReader:
    """The column list and per-column converters for reading claimed Job rows by hand.

    The converters are Django's own (naive MySQL and SQLite datetimes to aware ones...),
    or the dialect's cheaper ones of the same result (``Dialect.row_converters``), worked
    out once per connection (and ``USE_TZ``) instead of once per query; JSON columns without a
    custom decoder are decoded by :func:`_json_loads`, which does what
    ``JSONField.from_db_value`` does for a whole column.
    """
    key = (model, conn.alias, bool(django_settings.USE_TZ))
    if key not in _READERS:
        fields = [f for f in model._meta.concrete_fields if f.attname not in NOT_READ]
        columns = ", ".join(conn.ops.quote_name(str(f.column)) for f in fields)
        converters = []
        speaks = dialect(conn)
        for index, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            funcs = speaks.row_converters(conn, conn.ops.get_db_converters(col))
            if isinstance(field, JSONField) and field.decoder is None:
                funcs = [*funcs, _json_loads]
            else:
                funcs = funcs + field.get_db_converters(conn)
            if funcs:
                converters.append((index, col, funcs))
        _READERS[key] = RowReader(columns, [f.attname for f in fields], converters)
    return _READERS[key]


def job_from_row(
    model: type[Job], using: str, row: Sequence[Any], reader: RowReader, conn: BaseDatabaseWrapper
) -> Job:
    """A Job from a row, built as ``Model.from_db`` would but without ``Model.__init__``
    (its field-by-field setattr and its pre_init/post_init signals are most of the cost
    of a claim on the worker's side). Columns not read are deferred fields."""
    values = list(row)
    for index, col, funcs in reader.converters:
        value = values[index]
        if value is not None:
            for func in funcs:
                value = func(value, col, conn)
            values[index] = value
    return job_from_fields(model, using, zip(reader.names, values, strict=True))


def job_from_fields(model: type[Job], using: str, fields: Iterable[tuple[str, Any]]) -> Job:
    """A Job of these (attribute name, value) pairs, converted values as a claim reads
    them; the attributes not given are deferred fields."""
    job = model.__new__(model)
    job.__dict__.update(fields)
    state = job._state = ModelState()
    state.adding = False
    state.db = using
    return job


def fetch_rows(conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> Sequence[Any]:
    """The rows of a claim's statement, for :func:`job_from_row`, read through a cursor
    the dialect made ready for it (``Dialect.prepare_reading``)."""
    with conn.cursor() as cursor:
        dialect(conn).prepare_reading(conn, cursor)
        cursor.execute(sql, params)
        rows: Sequence[Any] = cursor.fetchall()
        return rows
