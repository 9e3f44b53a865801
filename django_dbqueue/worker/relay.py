"""One wake-up listener per host: the supervisor listens, its children hear it from it.

A listener of its own in every child cost a PostgreSQL server one ``LISTEN`` connection
per child: 3 hosts of 16 children took 99 of a server's 100 connections. So the
supervisor holds the host's one listener (``LISTEN`` on PostgreSQL, the Redis
subscription elsewhere: :mod:`.wakeup`) in a thread of its own, and relays what it hears
to its children through memory they share since the fork and a pipe per child:

- jobs announced for the host's queues (the children's queues: the same for all of them)
  or one of them paused or resumed: a byte on every child's pipe, which wakes a child
  waiting in :meth:`Ear.wait` (a child that is busy finds it there later, or drains it
  between claims with :meth:`Ear.switched`);
- when it last heard jobs announced (``heard_at``, a ``time.monotonic()``, the same clock
  in every process), which the children's claims need for coalesced announcements
  (worker/listening.py, :meth:`~.listening.Listening.idle`);
- how many times a queue was paused or resumed, which a child compares with what it saw
  last (:meth:`Ear.switched`).

When the supervisor's listener fails (its connection lost, Redis gone), the relay counts
it as a switch (a pause may have gone unheard: the children read the paused set again)
and tries to listen again, at once and then after 1, 2, 4 ... up to 30 s. Meanwhile the
children hear nothing and poll every ``POLL_INTERVAL``, as without a wake-up: a job waits
no longer than that. Once it listens again, it wakes every child, as if it had heard
jobs: what was announced while it was deaf is claimed then.

A worker run directly (``Worker(...).run()``, no supervisor) keeps its own listener.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import threading
from collections.abc import Sequence
from multiprocessing.sharedctypes import RawValue
from typing import Any

from django_dbqueue.worker import wakeup

__all__ = ["Ear", "Relay"]
logger = logging.getLogger("django_dbqueue.wakeup")

WAIT_SLICE = 0.25  # seconds the relay waits on its listener before it checks for a stop
# ... where it can wait on the listener's socket and on a pipe :meth:`Relay.stop` writes
# to at once (PostgreSQL's, and Redis's where redis-py shows it): stop() then ends the
# wait at once, and this is a safety net.
SOCKET_SLICE = 2.0
REOPEN_MAX = 30.0  # seconds, at most, between attempts to listen again


class _Shared(ctypes.Structure):
    """Written by the supervisor's relay thread only; read by the children."""

    _fields_ = [
        ("heard_at", ctypes.c_double),  # time.monotonic() jobs were last heard (or subscribed)
        ("switches", ctypes.c_int64),  # queues paused or resumed (and listeners lost) so far
    ]


class Ear:
    """A child's side of the relay: a :class:`~.wakeup.Listener` that opens nothing."""

    def __init__(self, shared: Any, fd: int) -> None:
        self._shared = shared
        self._fd = fd  # the read end of this child's pipe (non-blocking)
        self._switches = shared.switches

    @property
    def heard_at(self) -> float:
        return float(self._shared.heard_at)

    def _drain(self) -> bool:
        """Empty the pipe; True when there was something in it."""
        found = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 4096):
                found = True
        return found

    def wait(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        return bool(ready) and self._drain()

    def switched(self) -> bool:
        # What the pipe holds was heard before this claim begins: the claim serves it.
        self._drain()
        switches = self._shared.switches
        switched, self._switches = switches != self._switches, switches
        return bool(switched)

    def close(self) -> None:
        """Nothing to close: the pipe is the supervisor's, for this child's successors."""


class Relay:
    """Made by the supervisor before it forks: the shared memory and one pipe per child.
    :meth:`start` opens the listener and starts the thread that relays it. Where the
    workers poll (``WAKEUP`` off, MySQL/MariaDB or SQLite without Redis) it does nothing."""

    def __init__(self, queues: Sequence[str], size: int) -> None:
        self.queues = list(queues)
        self.on = wakeup.method() != "poll"
        self._shared: Any = RawValue(_Shared)
        self._size = size
        self._pipes: list[tuple[int, int]] = []  # made by start(): a relay never run has none
        self._listener: wakeup.Listener | None = None
        self._stop = threading.Event()
        self._stop_pipe: tuple[int, int] | None = None  # ends the thread's wait: stop()
        self._thread: threading.Thread | None = None
        self._pause = 0.0  # seconds before the next attempt to listen (0: at once)

    def ear(self, index: int) -> Ear | None:
        """Child ``index``'s side; None where it polls, or listens itself (a supervisor
        that spawns a child without having started its relay: tests)."""
        if not self.on or index >= len(self._pipes):
            return None
        return Ear(self._shared, self._pipes[index][0])

    def start(self) -> None:
        if not self.on:
            return
        self._pipes = [os.pipe() for _ in range(self._size)]
        self._stop_pipe = os.pipe()
        for read, write in [*self._pipes, self._stop_pipe]:
            os.set_blocking(read, False)
            os.set_blocking(write, False)
        self._open()  # before the children start, so that their first claims follow it
        self._thread = threading.Thread(target=self._run, name="dbqueue-wakeup-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._stop_pipe is not None:
            with contextlib.suppress(BlockingIOError):
                os.write(self._stop_pipe[1], b"!")
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                return  # stuck connecting: its pipes' numbers must not be reused under it
        self._close()
        for read, write in [*self._pipes, *([self._stop_pipe] if self._stop_pipe else [])]:
            os.close(read)
            os.close(write)
        self._pipes, self._stop_pipe = [], None

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._listener is None and not self._open():
                self._stop.wait(self._pause)
                continue
            assert self._listener is not None
            try:
                if self._wait(self._listener):
                    self._heard(self._listener.switched())
            except Exception as exc:
                logger.warning(
                    "Supervisor: wake-up listener failed (%s); its workers poll until it "
                    "listens again",
                    exc,
                    extra={"event": "wakeup_error"},
                )
                self._close()
                self._heard(switched=True)  # a pause may have gone unheard

    def _wait(self, listener: wakeup.Listener) -> bool:
        """Wait for ``listener`` to hear something, or for a stop; True when it heard."""
        fileno = getattr(listener, "fileno", None)
        socket = None if fileno is None else fileno()
        if socket is None or self._stop_pipe is None:
            return listener.wait(WAIT_SLICE)
        if listener.wait(0):  # what came in already: the socket may have been read
            return True
        select.select([socket, self._stop_pipe[0]], [], [], SOCKET_SLICE)
        return not self._stop.is_set() and listener.wait(0)

    def _open(self) -> bool:
        """Listen (a failure is logged by wakeup.listen); True once listening."""
        self._listener = wakeup.listen(self.queues)
        if self._listener is None:
            self._pause = min(REOPEN_MAX, max(1.0, 2 * self._pause))
            return False
        self._pause = 0.0
        # What was announced before this went unheard: the children claim once more.
        self._heard(switched=False)
        return True

    def _heard(self, switched: bool) -> None:
        if self._listener is not None:
            self._shared.heard_at = self._listener.heard_at
        if switched:
            self._shared.switches += 1
        for _, write in self._pipes:
            with contextlib.suppress(BlockingIOError):  # full: that child has a wake-up due
                os.write(write, b"!")

    def _close(self) -> None:
        if self._listener is not None:
            wakeup.close_quietly(self._listener)
            self._listener = None
