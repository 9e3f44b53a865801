"""MySQL/MariaDB only: keys and names compare exactly (a binary, no-pad collation).

MySQL and MariaDB compare strings by the column's collation, and the default ones
(``utf8mb4_general_ci``, ``utf8mb4_0900_ai_ci``...) ignore case and accents, and the
PAD SPACE ones ignore trailing spaces: ``unique_key="export:bob"`` found the job of
``"export:Bob"`` (and of ``"export:Böb"``, ``"export:Bob "``) and enqueued nothing; two
concurrency keys differing in case shared one limit. PostgreSQL and SQLite compare
exactly. So every column that holds a key or a name the queue compares is made binary
and NO PAD: ``<charset>_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on MySQL 8 (whose
``utf8mb4_bin`` pads); the character set and everything else about the column stay.

The model's state is unchanged (a RunPython, as 0008 and 0009): ``db_collation`` would
put a MySQL collation name into the model that PostgreSQL and SQLite would then be
asked to create. Its cost (one rebuild of each table, the job table's above all) is in
docs/upgrading.md; reversing it goes back to the table's default collation and fails if
rows now differ only in case, accents or trailing spaces where a unique index forbids it.
"""

from typing import Any

from django.db import migrations

# table -> its columns holding keys and names that the queue compares for equality.
EXACT_COLUMNS = {
    "dbqueue_job": ["queue", "unique_key", "origin_unique_key", "concurrency_key"],
    "dbqueue_concurrency": ["key"],
    "dbqueue_queue": ["name"],
    "dbqueue_counter": ["name"],
    "dbqueue_schedule_tick": ["schedule"],
    "dbqueue_duty": ["name"],
}


def exact_collation(connection: Any, charset: str) -> str:
    if connection.mysql_is_mariadb:
        return f"{charset}_nopad_bin"
    if charset == "utf8mb4":
        return "utf8mb4_0900_bin"
    return f"{charset}_bin"  # utf8mb3 on MySQL has no binary NO PAD collation


def columns_of(schema_editor: Any, table: str, names: list[str]) -> list[tuple[Any, ...]]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, CHARACTER_SET_NAME, IS_NULLABLE "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            [table],
        )
        return [row for row in cursor.fetchall() if row[0] in names]


def table_collation(schema_editor: Any, table: str) -> str:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            [table],
        )
        return str(cursor.fetchone()[0])


def modify(schema_editor: Any, exact: bool) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    qn = schema_editor.quote_name
    for table, names in EXACT_COLUMNS.items():
        default = table_collation(schema_editor, table)
        changes = []
        for name, column_type, charset, nullable in columns_of(schema_editor, table, names):
            collation = exact_collation(connection, charset) if exact else default
            null = "NULL" if nullable == "YES" else "NOT NULL"
            changes.append(
                f"MODIFY {qn(name)} {column_type} CHARACTER SET {charset} "
                f"COLLATE {collation} {null}"
            )
        if changes:  # one statement per table: one rebuild
            schema_editor.execute(f"ALTER TABLE {qn(table)} {', '.join(changes)}")


def forwards(apps: Any, schema_editor: Any) -> None:
    modify(schema_editor, exact=True)


def backwards(apps: Any, schema_editor: Any) -> None:
    modify(schema_editor, exact=False)


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0009_mysql_job_finished_index"),
    ]

    # DDL on MySQL/MariaDB commits at once: no transaction around it.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
