"""PostgreSQL only: index entries of dbqueue_job that every status change wrote for nothing.

PostgreSQL cannot update a job's row in place (HOT) when its status changes (the status
is indexed), so each claim and each finish adds an entry to every index of the table.
Three of them are narrowed:

- ``..._like``, the ``varchar_pattern_ops`` twin Django adds to the ``unique_key``
  unique index for ``LIKE`` lookups: nothing looks unique keys up by prefix. Dropped.
- ``dbq_job_concurrency`` (concurrency_key, id): most jobs have no key. Made partial
  (``WHERE concurrency_key IS NOT NULL``): a claim's ``concurrency_key = %s`` still reads
  it, and the rows of jobs without a key no longer enter it.
- ``dbq_job_finished`` (status, finished_at): made partial (``WHERE finished_at IS NOT
  NULL``). Its readers (history, failures since, pruning) all bound ``finished_at``; the
  queued and claimed versions of every job no longer enter it. It also stops competing
  with ``dbq_job_claim`` for the claim: with statistics taken while the table held
  mostly finished jobs, PostgreSQL read the whole backlog along this index (it starts
  with the status too) and sorted it, at every claim.

The model's state is unchanged (MySQL/MariaDB and SQLite keep their indexes as they
are: InnoDB writes a secondary index only when its columns change). See
docs/databases.md.
"""

from typing import Any

from django.db import migrations

CONCURRENCY_INDEX = "dbq_job_concurrency"
FINISHED_INDEX = "dbq_job_finished"


def _like_index(schema_editor: Any) -> str:
    return str(schema_editor._create_index_name("dbqueue_job", ["unique_key"], suffix="_like"))


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    qn = schema_editor.quote_name
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(_like_index(schema_editor))}")
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(CONCURRENCY_INDEX)}")
    schema_editor.execute(
        f"CREATE INDEX {qn(CONCURRENCY_INDEX)} ON {qn('dbqueue_job')} "
        f"({qn('concurrency_key')}, {qn('id')}) WHERE {qn('concurrency_key')} IS NOT NULL"
    )
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(FINISHED_INDEX)}")
    schema_editor.execute(
        f"CREATE INDEX {qn(FINISHED_INDEX)} ON {qn('dbqueue_job')} "
        f"({qn('status')}, {qn('finished_at')}) WHERE {qn('finished_at')} IS NOT NULL"
    )


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    qn = schema_editor.quote_name
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(CONCURRENCY_INDEX)}")
    schema_editor.execute(
        f"CREATE INDEX {qn(CONCURRENCY_INDEX)} ON {qn('dbqueue_job')} "
        f"({qn('concurrency_key')}, {qn('id')})"
    )
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(FINISHED_INDEX)}")
    schema_editor.execute(
        f"CREATE INDEX {qn(FINISHED_INDEX)} ON {qn('dbqueue_job')} "
        f"({qn('status')}, {qn('finished_at')})"
    )
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {qn(_like_index(schema_editor))} ON {qn('dbqueue_job')} "
        f"({qn('unique_key')} varchar_pattern_ops)"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0007_job_last_attempted_at"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
