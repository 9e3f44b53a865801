"""A redis-server of the test's own, to stop (SIGSTOP), resume and restart at will.

The shared server on 6379 is never touched: this one listens on a free port of its own,
keeps nothing on disk (``--save "" --appendonly no``) so a restart loses every key, as a
Redis without persistence does, and is killed when the test ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from tests.support import reap


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not self.answers():
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process cannot exit
            reap([self.proc])
            self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port: every key is gone."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, nothing is ever answered."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


@contextmanager
def own_redis(
    tmp_path: Path,
    alias: str = "own_redis",
    options: dict[str, Any] | None = None,
    **dbqueue: Any,
) -> Iterator[RedisServer]:
    """A started :class:`RedisServer`, as the django-redis cache ``alias`` (with the cache
    ``options`` added), with ``DBQUEUE`` updated by ``dbqueue``; stopped (and the settings
    restored) afterwards."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    caches = {
        **settings.CACHES,
        alias: {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient", **(options or {})},
        },
    }
    try:
        with override_settings(CACHES=caches, DBQUEUE={**settings.DBQUEUE, **dbqueue}):
            yield server
    finally:
        server.stop()
