"""MySQL/MariaDB only: the history index ``dbq_job_finished`` no longer changes at a claim.

InnoDB rewrites a secondary index entry whenever one of its columns changes. The index
was ``(status, finished_at)``: every claim (queued -> claimed) and every finish moved each
job's entry, two index writes per job of which only the finish's is of use to its
readers (history, "failed since", pruning, recent failures, which all look at finished
jobs). It is now ``(finished_status, finished_at)``, where ``finished_status`` is a
virtual generated column: the status once ``finished_at`` is set, NULL before. A claim
leaves it NULL, and InnoDB compares a virtual column's old and new values before it
touches an index on it: the claim no longer writes this index, the finish writes it
once. (An index on ``finished_at`` alone would cost the same, but its readers, which ask
for one status, would read every other status's rows in their range too.)

The readers name the column (``JobQuerySet.finished_with``). The model's state is
unchanged: PostgreSQL has its own partial index (0008), SQLite keeps the plain one. See
docs/databases.md.
"""

from typing import Any

from django.db import migrations

FINISHED_INDEX = "dbq_job_finished"
COLUMN = "finished_status"


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    qn = schema_editor.quote_name
    status = apps.get_model("django_dbqueue", "Job")._meta.get_field("status")
    schema_editor.execute(
        f"ALTER TABLE {qn('dbqueue_job')} DROP INDEX {qn(FINISHED_INDEX)}, "
        f"ADD COLUMN {qn(COLUMN)} {status.db_type(schema_editor.connection)} "
        f"AS (CASE WHEN {qn('finished_at')} IS NOT NULL THEN {qn('status')} END) VIRTUAL, "
        f"ADD INDEX {qn(FINISHED_INDEX)} ({qn(COLUMN)}, {qn('finished_at')})"
    )


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    qn = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE {qn('dbqueue_job')} DROP INDEX {qn(FINISHED_INDEX)}, "
        f"DROP COLUMN {qn(COLUMN)}, "
        f"ADD INDEX {qn(FINISHED_INDEX)} ({qn('status')}, {qn('finished_at')})"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0008_postgres_job_indexes"),
    ]

    # DDL on MySQL/MariaDB commits at once: no transaction around it.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
