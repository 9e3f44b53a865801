"""A MariaDB primary and a replica of it, the suite's own, on loopback; the replica can be
made to lag on purpose (``replica`` tests, tests/replica/; ``DBQUEUE_TEST_REPLICA=1``).

Both are Debian's ``mariadbd`` run as the ``mysql`` user (tests/support/mariadb_servers.py,
shared with the Galera cluster), their data under ``/var/tmp/dbqueue-replica/``
(``DBQUEUE_REPLICA_DIR``): the primary on 3310 (``log_bin``, ``server_id=1``,
``binlog_format=ROW``), the replica on 3311 (``server_id=2``, ``read_only``) replicating
from it by GTID (``CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos``). ``root`` from
127.0.0.1 without a password on both (made with ``sql_log_bin=0``: the binlog starts empty).

testproject's settings name the ports (``DBQUEUE_TEST_REPLICA=1``: "default" is the
primary, "replica" the replica, the same database name on both); the test database
pytest-django creates on the primary reaches the replica as every other write does.

Lag on purpose: :meth:`ReplicaPair.lagging` stops the replica's SQL thread (it still
receives the primary's binlog, applies nothing) for the block, then starts it again and
waits until it applied everything the primary wrote (``MASTER_GTID_WAIT``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import MySQLdb

from tests.support.mariadb_servers import (
    PrivateServer,
    fresh_directories,
    give_to_mysql,
    install_system_tables,
    require_mariadbd,
    wait_for,
)

USER = "root"
START_TIMEOUT = 60.0  # seconds for both servers and replication, on a machine under load
CATCH_UP_TIMEOUT = 60


def base_directory() -> Path:
    return Path(os.environ.get("DBQUEUE_REPLICA_DIR", "/var/tmp/dbqueue-replica"))


def configured_ports() -> tuple[int, int]:
    """(primary, replica): the ports testproject's settings give "default" and "replica"."""
    from django.conf import settings

    return int(settings.DATABASES["default"]["PORT"]), int(settings.DATABASES["replica"]["PORT"])


class ReplicaPair:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or base_directory()
        primary_port, replica_port = configured_ports()
        self.primary = PrivateServer(self.directory / "primary", "primary", primary_port)
        self.replica = PrivateServer(self.directory / "replica", "replica", replica_port)
        self.servers = [self.primary, self.replica]

    def commands(self) -> tuple[list[str], list[str]]:
        primary = [
            *self.primary.base_command(),
            "--server-id=1",
            "--log-bin=primary-bin",
            "--binlog-format=ROW",
        ]
        replica = [
            *self.replica.base_command(),
            "--server-id=2",
            "--read-only=ON",
            "--relay-log=replica-relay-bin",
            "--log-bin=replica-bin",  # a GTID position of its own to wait on
        ]
        return primary, replica

    def start(self) -> None:
        require_mariadbd("the replica suite")
        deadline = time.monotonic() + START_TIMEOUT
        fresh_directories(self.directory, self.servers)
        for server in self.servers:
            install_system_tables(server)
        give_to_mysql(self.directory)
        for server, command in zip(self.servers, self.commands(), strict=True):
            server.launch(command)
        user = (
            "SET sql_log_bin = 0;"
            f"CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1';"
            f"GRANT ALL ON *.* TO '{USER}'@'127.0.0.1' WITH GRANT OPTION;"
        )
        for server in self.servers:
            wait_for(deadline, lambda s=server: s.root_sql(user), self.servers, "the replica pair")  # type: ignore[misc]
        self.replica_sql(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
            f"MASTER_USER='{USER}', MASTER_PASSWORD='', MASTER_CONNECT_RETRY=1, "
            "MASTER_USE_GTID=slave_pos"
        )
        self.replica_sql("START SLAVE")
        wait_for(deadline, self.replicating, self.servers, "replication")

    def stop(self) -> None:
        """Both servers stopped, and their directory removed."""
        for server in reversed(self.servers):
            server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- queries --------------------------------------------------------------------

    def query(
        self, server: PrivateServer, sql: str, params: Any = None, database: str | None = None
    ) -> list[tuple[Any, ...]]:
        conn = server.connect_as(USER, database)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall())
        finally:
            conn.close()

    def replica_sql(self, sql: str) -> None:
        self.query(self.replica, sql)

    def status(self) -> dict[str, Any]:
        """SHOW SLAVE STATUS of the replica, as a dict ({} while it does not answer)."""
        try:
            conn = self.replica.connect_as(USER)
        except MySQLdb.MySQLError:
            return {}
        try:
            with conn.cursor(MySQLdb.cursors.DictCursor) as cursor:
                cursor.execute("SHOW SLAVE STATUS")
                return dict(cursor.fetchone() or {})
        finally:
            conn.close()

    def replicating(self) -> bool:
        status = self.status()
        return status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes"

    # -- lag on purpose -------------------------------------------------------------

    def stop_applying(self) -> None:
        """The replica keeps receiving the primary's binlog and applies none of it."""
        self.replica_sql("STOP SLAVE SQL_THREAD")

    def catch_up(self) -> None:
        """Apply again, and return once the replica has everything the primary wrote."""
        self.replica_sql("START SLAVE SQL_THREAD")
        (position,) = self.query(self.primary, "SELECT @@GLOBAL.gtid_binlog_pos")[0]
        (waited,) = self.query(
            self.replica, "SELECT MASTER_GTID_WAIT(%s, %s)", [position, CATCH_UP_TIMEOUT]
        )[0]
        if waited != 0:
            raise AssertionError(f"the replica did not catch up with {position}: {self.status()}")

    @contextmanager
    def lagging(self) -> Iterator[None]:
        """The replica applies nothing of what the primary writes during the block."""
        self.stop_applying()
        try:
            yield
        finally:
            self.catch_up()


@contextmanager
def running_pair() -> Iterator[ReplicaPair]:
    pair = ReplicaPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()
