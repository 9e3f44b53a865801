"""Statements the database server counted, for the claim-stream measurements and tests.

MariaDB/MySQL: ``information_schema.USER_STATISTICS`` (``userstat=ON``: the scale suite's
private server, tests/support/scale_servers.py) for the user the workers connect as: its
SELECT, UPDATE and other commands (the others include ``START TRANSACTION`` and
``COMMIT``). PostgreSQL: ``pg_stat_database`` for the database of the run: its commits
and rollbacks, one per statement outside a transaction and one per transaction, so below
the statements. Other clients of the same user (MariaDB) or database (PostgreSQL) count
too: read them around work no one else does.
"""

from __future__ import annotations

from django.db import connection


def counters() -> dict[str, int]:
    """The server's counts now (MariaDB: select, update, other, commit, rollback;
    PostgreSQL: commit, rollback)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT SELECT_COMMANDS, UPDATE_COMMANDS, OTHER_COMMANDS, COMMIT_TRANSACTIONS,"
                " ROLLBACK_TRANSACTIONS FROM information_schema.USER_STATISTICS WHERE USER = %s",
                [connection.settings_dict["USER"]],
            )
            row = cursor.fetchone() or (0, 0, 0, 0, 0)
            keys = ("select", "update", "other", "commit", "rollback")
            return dict(zip(keys, map(int, row), strict=True))
        cursor.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s",
            [connection.settings_dict["NAME"]],
        )
        commit, rollback = cursor.fetchone()
        return {"commit": int(commit), "rollback": int(rollback)}


def statements(before: dict[str, int], after: dict[str, int]) -> int:
    """The statements between two :func:`counters` (PostgreSQL: its transactions)."""
    if connection.vendor == "mysql":
        return sum(after[key] - before[key] for key in ("select", "update", "other"))
    return sum(after[key] - before[key] for key in ("commit", "rollback"))
