"""New rows: the multi-row INSERT behind ``enqueue_many`` (``enqueue`` uses ``Model.save``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_dbqueue.queue.dialects import insert_rows

if TYPE_CHECKING:
    from django_dbqueue.models import Job


def insert_many(model: type[Job], using: str, jobs: Sequence[Job], batch_size: int) -> list[Job]:
    """INSERT jobs in multi-row statements; sets their ids where the database says them.

    What ``bulk_create`` does, minus its per-value overhead: values that repeat
    (the queue, the enqueue time, an empty argument list) are prepared once.
    MariaDB, PostgreSQL and SQLite return the new ids; MySQL does not, and there the
    jobs keep ``id = None``, as with ``bulk_create``.
    """
    if not jobs:
        return []
    conn = connections[using]
    qn = conn.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(qn(f.attname) for f in fields)
    memo: list[dict[Any, Any]] = [{} for _ in fields]
    rows: list[list[Any]] = []
    for job in jobs:
        row = []
        for index, field in enumerate(fields):
            value = getattr(job, field.attname)
            if isinstance(value, list | dict):
                key = json.dumps(value) if value else type(value).__name__
            else:
                key = value
            try:
                prepared = memo[index][key]
            except KeyError:
                prepared = memo[index][key] = field.get_db_prep_save(value, conn)
            row.append(prepared)
        rows.append(row)
    new_ids = insert_rows(conn, qn(model._meta.db_table), columns, rows, batch_size)
    if new_ids is not None:
        for job, new_id in zip(jobs, new_ids, strict=True):
            job.id = new_id
            job._state.adding, job._state.db = False, using
    return list(jobs)
