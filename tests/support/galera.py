"""A 3-node MariaDB Galera Cluster of the test's own, on loopback, started and stopped by
the suite (``galera`` tests; ``nox -s galera``).

The shared MariaDB on 3306 is never touched. Each node is a ``mariadbd`` of Debian's
MariaDB 10.11 with the provider ``/usr/lib/galera/libgalera_smm.so``, SQL on 3321-3323,
group communication on 4601-4603 (``gmcast.listen_addr``), IST on 4611-4613 and rsync SST
on 4621-4623, its data under ``/var/tmp/dbqueue-galera/`` (``DBQUEUE_GALERA_DIR``) owned by the
``mysql`` user (rsync SST cannot enter a root-owned directory). n1 bootstraps the cluster
(``--wsrep-new-cluster``), n2 and n3 join it by SST; the cluster is ready when every node
says ``wsrep_ready=ON`` and ``wsrep_cluster_size=3``.

The settings the suite runs with are the ones docs/databases.md recommends:
``wsrep_sync_wait=1`` (a read waits until the node applied every write committed before
it, anywhere), ``innodb_autoinc_lock_mode=2``, ``binlog_format=ROW``.

Django code under test runs in processes of its own (workers, lock holders, ``check``):
:meth:`GaleraCluster.env` gives the environment that points testproject's settings at one
node (``MYSQL_PORT``, ``DBQUEUE_DB_NAME``), and :meth:`GaleraCluster.connect` a plain
PyMySQL connection for the test's own reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import MySQLdb

from tests.support import ROOT
from tests.support.mariadb_servers import (
    PrivateServer,
    fresh_directories,
    give_to_mysql,
    install_system_tables,
    wait_for,
)

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
SQL_PORTS = (3321, 3322, 3323)
GROUP_PORTS = (4601, 4602, 4603)
IST_PORTS = (4611, 4612, 4613)
SST_PORTS = (4621, 4622, 4623)
USER = "dbq"
DATABASE = "test_dbq_galera31"
START_TIMEOUT = 90.0  # seconds for the whole cluster, on a machine under load

# What every node runs with; see docs/databases.md, "MariaDB Galera Cluster".
SETTINGS = {
    "wsrep_sync_wait": "1",
    "innodb_autoinc_lock_mode": "2",
    "binlog_format": "ROW",
}


def base_directory() -> Path:
    return Path(os.environ.get("DBQUEUE_GALERA_DIR", "/var/tmp/dbqueue-galera"))


class GaleraNode(PrivateServer):
    def __init__(self, cluster: GaleraCluster, index: int) -> None:
        super().__init__(cluster.directory / f"n{index + 1}", f"n{index + 1}", SQL_PORTS[index])
        self.cluster = cluster
        self.index = index  # 0, 1, 2: n1, n2, n3

    def command(self, bootstrap: bool) -> list[str]:
        members = ",".join(f"127.0.0.1:{p}" for p in GROUP_PORTS)
        provider_options = (
            f"gmcast.listen_addr=tcp://127.0.0.1:{GROUP_PORTS[self.index]};"
            f"ist.recv_addr=127.0.0.1:{IST_PORTS[self.index]};"
            "gcache.size=64M;evs.suspect_timeout=PT5S;evs.inactive_timeout=PT10S"
        )
        command = [
            *self.base_command(),
            "--wsrep-on=ON",
            f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-address=gcomm://{members}",
            "--wsrep-cluster-name=dbqueue_galera31",
            f"--wsrep-node-name={self.name}",
            "--wsrep-node-address=127.0.0.1",
            f"--wsrep-provider-options={provider_options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{SST_PORTS[self.index]}",
            "--wsrep-slave-threads=2",
        ]
        command += [f"--{key.replace('_', '-')}={value}" for key, value in SETTINGS.items()]
        if bootstrap:
            command.append("--wsrep-new-cluster")
        return command

    def start(self, bootstrap: bool = False) -> None:
        self.launch(self.command(bootstrap))

    def connect(self, database: str | None = DATABASE, **options: Any) -> Any:
        return self.connect_as(USER, database, **options)

    def status(self) -> dict[str, str]:
        """The node's wsrep status, or {} while it does not answer."""
        try:
            conn = self.connect(database=None)
        except MySQLdb.MySQLError:
            return {}
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep%%'")
                return {str(k): str(v) for k, v in cursor.fetchall()}
        finally:
            conn.close()

    def ready(self) -> bool:
        status = self.status()
        return status.get("wsrep_ready") == "ON" and status.get("wsrep_cluster_size") == "3"


class GaleraCluster:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or base_directory()
        self.nodes = [GaleraNode(self, i) for i in range(3)]

    def prepare(self) -> None:
        """Fresh data directories, owned by mysql; n1's initialised (the others get SST)."""
        fresh_directories(self.directory, self.nodes)
        install_system_tables(self.nodes[0])
        give_to_mysql(self.directory)

    def start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        self.prepare()
        first = self.nodes[0]
        first.start(bootstrap=True)
        self.wait(deadline, lambda: first.socket.exists() and self.bootstrap_user())
        for node in self.nodes[1:]:
            node.start()
            # One SST at a time: two joiners asking n1 at once make one wait its turn anyway.
            self.wait(deadline, lambda n=node: n.status().get("wsrep_ready") == "ON")  # type: ignore[misc]
        self.wait(deadline, lambda: all(n.ready() for n in self.nodes))
        with self.nodes[0].connect(database=None) as conn, conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
        self.migrate()

    def bootstrap_user(self) -> bool:
        """The test user on every node (it replicates), made through n1's socket as root."""
        return self.nodes[0].root_sql(
            f"CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1';"
            f"GRANT ALL ON *.* TO '{USER}'@'127.0.0.1' WITH GRANT OPTION;"
        )

    def wait(self, deadline: float, predicate: Any) -> None:
        wait_for(deadline, predicate, self.nodes, "the Galera cluster")

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT,
            env=self.env(0),
            check=True,
        )

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def env(self, node: int, **dbqueue_settings: Any) -> dict[str, str]:
        """The environment of a Django process whose default database is node ``node``."""
        env = dict(os.environ)
        env.update(
            DBQUEUE_DB="mysql",
            DBQUEUE_DB_NAME=DATABASE,
            MYSQL_PORT=str(SQL_PORTS[node]),
            MYSQL_HOST="127.0.0.1",
            MYSQL_USER=USER,
            MYSQL_PASSWORD="",
            DBQUEUE_SETTINGS_JSON=json.dumps(dbqueue_settings),
            PYTHONUNBUFFERED="1",
        )
        env.pop("DBQUEUE_QUEUE_DB", None)
        return env

    def connect(self, node: int = 0) -> Any:
        return self.nodes[node].connect()

    def query(self, sql: str, params: Any = None, node: int = 0) -> list[tuple[Any, ...]]:
        with self.connect(node) as conn, conn.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def truncate(self, *tables: str) -> None:
        """Empty these tables (names of the suite's own, never input)."""
        with self.connect(0) as conn, conn.cursor() as cursor:
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")  # noqa: S608


def conflict_warnings(outputs: list[str]) -> list[str]:
    """The lines of workers' outputs that report a conflict (1213) as a warning: a
    certification conflict must be retried quietly (DEBUG), never one of these."""
    return [
        line
        for out in outputs
        for line in out.splitlines()
        if "WARNING" in line and ("1213" in line or "Deadlock" in line)
    ]


@contextmanager
def running_cluster() -> Iterator[GaleraCluster]:
    cluster = GaleraCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
