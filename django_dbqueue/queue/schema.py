"""Is the job database migrated? Commands ask before they start, to say so in one line
instead of failing on their first query with "table doesn't exist"."""

from __future__ import annotations

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

APP_LABEL = "django_dbqueue"


def migrate_command(using: str) -> str:
    flag = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
    return f"python manage.py migrate{flag}"


def schema_problem(using: str) -> str | None:
    """One line saying what is missing from database ``using``, or None when the queue's
    tables are there and every migration of the app is applied."""
    connection = connections[using]
    tables = set(connection.introspection.table_names())
    missing = [
        model._meta.db_table
        for model in apps.get_app_config(APP_LABEL).get_models()
        if model._meta.db_table not in tables
    ]
    if missing:
        return (
            f"The job tables are missing from database {using!r} ({', '.join(missing)}): "
            f"run `{migrate_command(using)}` first."
        )
    executor = MigrationExecutor(connection)
    leaves = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    pending = [
        migration.name
        for migration, _backwards in executor.migration_plan(leaves)
        if migration.app_label == APP_LABEL
    ]
    if pending:
        return (
            f"Database {using!r} has unapplied {APP_LABEL} migrations ({', '.join(pending)}): "
            f"run `{migrate_command(using)}` first."
        )
    return None
