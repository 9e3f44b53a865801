"""Private MariaDB servers the suite starts and stops itself, on loopback: the parts the
Galera cluster (tests/support/galera.py) and the primary + replica pair
(tests/support/replica.py) share. The shared server on 3306 is never touched.

Each server is Debian's ``mariadbd`` run as the ``mysql`` user, with its data, socket,
pid file and logs in a directory of its own (owned by ``mysql``), root reachable only
through that socket until a test user is made.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import MySQLdb
import pytest

MARIADBD = "/usr/sbin/mariadbd"


def require_mariadbd(suite: str) -> None:
    """Skip ``suite`` where Debian's mariadbd is missing; under CI=true fail instead: CI
    must run it, never pass by leaving it out."""
    if shutil.which("mariadbd") or Path(MARIADBD).exists():
        return
    message = f"{suite} needs Debian's mariadb-server ({MARIADBD} is missing)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class PrivateServer:
    """One ``mariadbd`` of the suite's own: its command line, start, stop, logs."""

    def __init__(self, directory: Path, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.directory / "mysqld.sock"

    @property
    def datadir(self) -> Path:
        return self.directory / "data"

    def base_command(self) -> list[str]:
        """What every private server runs with; callers add their own options."""
        return [
            shutil.which("mariadbd") or MARIADBD,
            "--no-defaults",
            "--user=mysql",
            f"--datadir={self.datadir}",
            f"--socket={self.socket}",
            f"--pid-file={self.directory / 'mysqld.pid'}",
            f"--log-error={self.directory / 'error.log'}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
            "--performance-schema=OFF",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=32M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=300",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            "--default-storage-engine=InnoDB",
        ]

    def launch(self, command: Sequence[str]) -> None:
        log = open(self.directory / "stdout.log", "ab")
        self.proc = subprocess.Popen(list(command), stdout=log, stderr=log)
        log.close()

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def connect_as(self, user: str, database: str | None = None, **options: Any) -> Any:
        return MySQLdb.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            charset="utf8mb4",
            connect_timeout=5,
            autocommit=True,
            **({"database": database} if database else {}),
            **options,
        )

    def root_sql(self, sql: str) -> bool:
        """Run ``sql`` as root through the socket (the only way in at first); True if it
        worked."""
        done = subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-e", sql],
            capture_output=True,
        )
        return done.returncode == 0

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it does not go."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed host would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def error_log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def fresh_directories(base: Path, servers: Sequence[PrivateServer]) -> None:
    """An empty ``base`` with each server's (empty) data directory in it."""
    if base.exists():
        shutil.rmtree(base)
    for server in servers:
        server.datadir.mkdir(parents=True)


def install_system_tables(server: PrivateServer) -> None:
    """``mariadb-install-db`` into the server's data directory (root by socket only)."""
    subprocess.run(
        [
            "mariadb-install-db",
            "--no-defaults",
            "--user=mysql",
            f"--datadir={server.datadir}",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ],
        check=True,
        capture_output=True,
    )


def give_to_mysql(base: Path) -> None:
    """``base`` and everything in it owned by the ``mysql`` user the servers run as."""
    shutil.chown(base, "mysql", "mysql")
    for path in base.rglob("*"):
        shutil.chown(path, "mysql", "mysql")


def wait_for(
    deadline: float, predicate: Callable[[], Any], servers: Sequence[PrivateServer], what: str
) -> None:
    """Until ``predicate()``; fails at once with its log when a server exited, and with
    every log at ``deadline`` (a time.monotonic())."""
    while not predicate():
        for server in servers:
            if server.exited():
                raise AssertionError(f"{what}: {server.name} exited:\n{server.error_log()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {s.name}\n{s.error_log()}" for s in servers)
            raise AssertionError(f"{what}: not ready in time\n{logs}")
        time.sleep(0.2)
