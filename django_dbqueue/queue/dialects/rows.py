"""The rows of a multi-row INSERT, and the portable way to insert them: ``VALUES`` lists.

:class:`Rows` holds each column's values prepared for the database; a dialect's
``insert_rows`` turns batches of them into statements (``unnest`` arrays on PostgreSQL,
``JSON_TABLE`` on MariaDB, :func:`insert_values` elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

# done(start, stop, ids) of insert_rows: called for each statement's rows once it has run.
Done = Callable[[int, int, "list[int] | None"], None]


def nothing(start: int, stop: int, ids: list[int] | None) -> None:
    """The ``done`` of a caller that needs no report."""


def placeholders(count: int) -> str:
    """``%s, %s, ...``: the driver fills in the values; only the count is formatted in."""
    return ", ".join(["%s"] * count)


class Rows:
    """Rows to insert: ``columns`` hold each field's values prepared for the database
    (JSON as text), a list of ``count`` values where ``varying`` says so, else the one
    value of every row. ``offset``: the number of the first row, for ``done``."""

    def __init__(
        self, columns: Sequence[Any], varying: Sequence[bool], count: int, offset: int = 0
    ) -> None:
        self.columns, self.varying, self.count, self.offset = columns, varying, count, offset

    def part(self, start: int, stop: int) -> Rows:
        """The rows ``start:stop`` of these."""
        pairs = zip(self.columns, self.varying, strict=True)
        columns = [column[start:stop] if varies else column for column, varies in pairs]
        return Rows(columns, self.varying, stop - start, self.offset + start)

    def varying_values(self) -> list[Any]:
        """The values of the varying columns, one list per column."""
        return [c for c, v in zip(self.columns, self.varying, strict=True) if v]


def insert_values(
    conn: BaseDatabaseWrapper,
    table: str,
    names: list[str],
    batches: Iterable[Rows],
    done: Done,
) -> list[int] | None:
    """Multi-row ``VALUES``, with ``RETURNING`` where it exists (SQLite; MySQL has none:
    None is returned)."""
    # SQLite binds at most 32,766 parameters per statement.
    most = max(1, 30_000 // len(names))
    placeholder = f"({placeholders(len(names))})"
    returning = bool(conn.features.can_return_rows_from_bulk_insert)
    new_ids: list[int] = []
    with conn.cursor() as cursor:
        for batch in batches:
            for start in range(0, batch.count, most):
                rows = batch.part(start, min(start + most, batch.count))
                sources = [
                    c if v else repeat(c, rows.count)
                    for c, v in zip(rows.columns, rows.varying, strict=True)
                ]
                sql = (
                    f"INSERT INTO {table} ({', '.join(names)}) VALUES "  # noqa: S608
                    f"{', '.join([placeholder] * rows.count)}"
                )
                if returning:
                    sql += f" RETURNING {conn.ops.quote_name('id')}"
                params = [value for row in zip(*sources, strict=False) for value in row]
                cursor.execute(sql, params)
                ids = [row[0] for row in cursor.fetchall()] if returning else None
                done(rows.offset, rows.offset + rows.count, ids)
                new_ids += ids or []
    return new_ids if returning else None
