"""A PgBouncer of the suite's own, in transaction pooling mode, in front of the shared
PostgreSQL (the ``pgbouncer`` fixture; PostgreSQL runs only).

Debian's ``pgbouncer`` package, started privately: its ini, userlist, pid and log files
under ``/var/tmp/dbqueue-pgbouncer`` (``DBQUEUE_PGBOUNCER_DIR``), listening on
127.0.0.1:6432 (``DBQUEUE_PGBOUNCER_PORT``), ``pool_mode = transaction``, ``auth_type =
trust``, every database name passed through to the server the test run uses (PGHOST,
PGPORT). PgBouncer refuses to run as root: as root it runs with ``-u postgres``. It is
stopped (SIGINT: at once, every connection closed) when the suite ends, before the test
database is dropped.

Django code under test reaches it in processes of their own through :meth:`env` (testproject's
settings take ``PGPORT`` and, with ``DBQUEUE_TEST_PGBOUNCER=1``, the options Django needs
behind a transaction pooler), or in the test's process through the alias :data:`ALIAS`
(the ``pgbouncer_alias`` fixture).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PORT = int(os.environ.get("DBQUEUE_PGBOUNCER_PORT", "6432"))
ALIAS = "pgbouncer"  # the Django alias that goes through it (tests/conftest.py)
START_TIMEOUT = 30.0  # seconds, on a loaded machine


def base_directory() -> Path:
    return Path(os.environ.get("DBQUEUE_PGBOUNCER_DIR", "/var/tmp/dbqueue-pgbouncer"))


def installed() -> str | None:
    """The pgbouncer executable (Debian puts it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def ini(directory: Path, server_host: str, server_port: str, port: int) -> str:
    return f"""\
[databases]
* = host={server_host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "userlist.txt"}
pool_mode = transaction
max_client_conn = 200
default_pool_size = 5
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {directory / "pgbouncer.log"}
pidfile = {directory / "pgbouncer.pid"}
"""


class PgBouncer:
    def __init__(self, user: str, server_host: str, server_port: str) -> None:
        self.directory = base_directory()
        self.port = PORT
        self.user = user
        self.server_host = server_host
        self.server_port = server_port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        executable = installed()
        assert executable, "pgbouncer is not installed (apt-get install pgbouncer)"
        assert not self.answers(), f"something already listens on 127.0.0.1:{self.port}"
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        config = self.directory / "pgbouncer.ini"
        config.write_text(ini(self.directory, self.server_host, self.server_port, self.port))
        (self.directory / "userlist.txt").write_text(f'"{self.user}" ""\n')
        command = [executable, str(config)]
        if os.getuid() == 0:  # "PgBouncer should not run as root"
            owner = pwd.getpwnam("postgres")
            for path in (self.directory, *self.directory.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command[1:1] = ["-u", "postgres"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.answers():
            if self.proc.poll() is not None:
                raise AssertionError(f"pgbouncer exited at start: {self.log_tail()}")
            assert time.monotonic() < deadline, f"pgbouncer did not start: {self.log_tail()}"
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def log_tail(self) -> str:
        stderr = b""
        if self.proc is not None and self.proc.poll() is not None and self.proc.stderr:
            stderr = self.proc.stderr.read()
        log = self.directory / "pgbouncer.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return (stderr.decode(errors="replace") + text)[-2000:]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (a worker_env) with the database reached through this PgBouncer."""
        return {**base, "PGPORT": str(self.port), "DBQUEUE_TEST_PGBOUNCER": "1"}
