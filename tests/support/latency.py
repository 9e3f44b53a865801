"""A round-trip delay injected in the database drivers, where ``tc netem`` is not available.

``DBQUEUE_TEST_DELAY_MS=20``: every request a connection of this process (and of the
processes it forks) sends to the server waits 20 ms first, as one round trip over a
network 20 ms long would. A request is what waits for the server's answer: on
MySQL/MariaDB (mysqlclient) each ``query``, ``commit``, ``rollback``, ``ping`` and change
of ``autocommit``; on PostgreSQL (psycopg 3) each time the client waits on the socket
for an answer (the generators ``Connection.wait`` runs yield then: the implicit BEGIN
and the statement after it are two). Connecting is not delayed. Requests are counted
too (:func:`sent`), per process.

Installed by :func:`install` (``tests/support/counted_claims.py`` calls it when the
variable is set, before ``run_jobs`` forks its children). Test support only: nothing in
``django_dbqueue`` knows of it.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Generator
from typing import Any

VARIABLE = "DBQUEUE_TEST_DELAY_MS"
_state = {"delay": 0.0, "sent": 0, "installed": 0}


def sent() -> int:
    """Requests this process sent since :func:`install` (delayed or not)."""
    return _state["sent"]  # type: ignore[return-value]


def _request() -> None:
    _state["sent"] += 1
    if _state["delay"]:
        time.sleep(_state["delay"])


def _delayed(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _request()
        return method(*args, **kwargs)

    return wrapper


def _answers_delayed(gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """psycopg's generator of one operation, each wait for the server delayed: it yields
    when what it sent needs an answer that has not come yet."""
    ready = None
    while True:
        try:
            waiting = gen.send(ready)
        except StopIteration as stop:
            return stop.value
        _request()
        ready = yield waiting


def _delay_mysql() -> None:
    from MySQLdb.connections import Connection  # type: ignore[import-untyped]

    for name in ("query", "commit", "rollback", "ping"):
        setattr(Connection, name, _delayed(getattr(Connection, name)))
    switch = Connection.autocommit

    def autocommit(self: Any, on: Any) -> None:
        if self.get_autocommit() != bool(on):  # mysqlclient sends only a change
            _delayed(switch)(self, on)

    Connection.autocommit = autocommit


def _delay_postgres() -> None:
    import psycopg

    wait = psycopg.Connection.wait

    @functools.wraps(wait)
    def delayed_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        return wait(self, _answers_delayed(gen), *args, **kwargs)

    psycopg.Connection.wait = delayed_wait  # type: ignore[method-assign]


def install(milliseconds: float | None = None) -> None:
    """Delay every request of this process's database connections by ``milliseconds``
    (default: ``DBQUEUE_TEST_DELAY_MS``, else 0: counted, not delayed). Once per process."""
    if milliseconds is None:
        milliseconds = float(os.environ.get(VARIABLE) or 0)
    _state["delay"] = milliseconds / 1000
    if _state["installed"]:
        return
    _state["installed"] = 1
    for patch in (_delay_mysql, _delay_postgres):
        try:
            patch()
        except ImportError:  # that driver is not installed: its connections do not exist
            pass
