"""The scale suite's private servers: a MariaDB that counts statements per user
(``userstat``) and a PostgreSQL with room for many hosts' connections, on loopback.

    python -m tests.support.scale_servers start   # before the scale runs (nox -s scale)
    python -m tests.support.scale_servers stop    # after them, even when they failed

The shared servers (3306, 5432) are never touched: their ``userstat`` is off and
PostgreSQL's 100 connections are shared with every other run, where 3 hosts x 16
children of the scale tests would take most of them. Ports: DBQUEUE_SCALE_MYSQL_PORT
(default 3330) and DBQUEUE_SCALE_PG_PORT (3331); data under DBQUEUE_SCALE_DIR
(/var/tmp/dbqueue-scale). Both run as their own system users (``mysql``, ``postgres``),
so starting them needs root, as the Galera and replica suites do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.mariadb_servers import (
    PrivateServer,
    fresh_directories,
    give_to_mysql,
    install_system_tables,
    require_mariadbd,
    wait_for,
)

START_TIMEOUT = 60.0  # seconds, on a loaded machine
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def base_directory() -> Path:
    return Path(os.environ.get("DBQUEUE_SCALE_DIR", "/var/tmp/dbqueue-scale"))


def ports() -> tuple[int, int]:
    """(MariaDB, PostgreSQL)."""
    mysql = int(os.environ.get("DBQUEUE_SCALE_MYSQL_PORT", "3330"))
    return mysql, int(os.environ.get("DBQUEUE_SCALE_PG_PORT", "3331"))


def mariadb() -> PrivateServer:
    return PrivateServer(base_directory() / "mariadb", "scale-mariadb", ports()[0])


def start_mariadb() -> None:
    require_mariadbd("the scale suite")
    server = mariadb()
    fresh_directories(server.directory, [server])
    install_system_tables(server)
    give_to_mysql(server.directory)
    server.launch([*server.base_command(), "--userstat=1", "--max-connections=400"])
    user = (
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';"
        "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
    )
    deadline = time.monotonic() + START_TIMEOUT
    wait_for(deadline, lambda: server.root_sql(user), [server], "the scale MariaDB")


def _as_postgres(*command: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True)


def start_postgres() -> None:
    data = base_directory() / "postgres"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    shutil.chown(data, "postgres", "postgres")
    _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust")
    options = (
        f"-p {ports()[1]} -c listen_addresses=127.0.0.1 -c max_connections=400 "
        f"-c unix_socket_directories={data} -c fsync=off -c synchronous_commit=off "
        "-c shared_buffers=64MB"
    )
    log = data / "server.log"
    pg_ctl = str(PG_BIN / "pg_ctl")
    _as_postgres(pg_ctl, "-D", str(data), "-o", options, "-l", str(log), "-w", "start")


def stop() -> None:
    server = mariadb()
    pid_file = server.directory / "mysqld.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 15)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    data = base_directory() / "postgres"
    if (data / "postmaster.pid").exists():
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
    shutil.rmtree(base_directory(), ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        stop()  # what a run killed before its end left behind
        start_mariadb()
        start_postgres()
    elif sys.argv[1:] == ["stop"]:
        stop()
    else:
        raise SystemExit("usage: python -m tests.support.scale_servers start|stop")
