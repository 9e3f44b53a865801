"""The worker's ear: waiting for a wake-up between claims, and hearing queues switched.

The listener itself (LISTEN on PostgreSQL, a Redis channel elsewhere) is
:mod:`.wakeup`'s, or, in a supervisor's child, the supervisor's, relayed
(:mod:`.relay`); :class:`Listening` opens it (again, every 30 s, after it failed), waits
on it while the worker is idle, and reads between claims whether a queue was paused or
resumed. Without a listener the worker polls, and pauses are read every
``PauseWatcher`` interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from django_dbqueue.conf import settings
from django_dbqueue.worker import wakeup
from django_dbqueue.worker.recording import log_fields

logger = logging.getLogger("django_dbqueue.worker")

REOPEN_AFTER = 30.0  # seconds between attempts to open a listener that failed


class Listening:
    def __init__(
        self,
        name: str,
        queues: Sequence[str],
        stopping: threading.Event,
        relayed: wakeup.Listener | None = None,
    ) -> None:
        self.name = name
        self.queues = list(queues)
        self.stopping = stopping
        # A supervisor's child hears its supervisor's listener (worker/relay.py).
        self.relayed = relayed
        self.listener: wakeup.Listener | None = None
        self._retry_at = 0.0
        self.claim_began = 0.0  # time.monotonic() when the last claim began (see idle)

    def listen(self) -> float:
        """Open the wake-up listener if there is none (retried every 30 s); returns now."""
        now = time.monotonic()
        if self.listener is None and now >= self._retry_at:
            self.listener = self.relayed or wakeup.listen(self.queues)
            self._retry_at = now + REOPEN_AFTER
        return now

    def switched(self) -> bool:
        """Was one of our queues paused or resumed since the last claim (as far as the
        wake-up channel says; without one, the PauseWatcher's interval decides)?"""
        self.listen()
        if self.listener is None:
            return False
        try:
            return self.listener.switched()
        except Exception as exc:
            self._failed(exc)
            return True  # it may have missed a pause: read the paused set again

    def idle(self, poll_sleep: float) -> None:
        """Wait for a wake-up notification, or for the next poll when there is none.

        One announcement may stand for several jobs: a process announces the same queues
        at most once per ``wakeup.COALESCE`` seconds, so a job committed just after an
        announcement goes unannounced. Every worker that heard that announcement begins
        a claim no earlier than ``COALESCE`` after hearing it, which is after such a job
        committed: when the claim that came back empty began before then, one more
        follows at ``heard_at + COALESCE`` (the reasoning is in worker/wakeup.py,
        "Coalescing"). What counts is when the claim began, not when it returned: its
        reads see what was committed when it began.
        """
        now = self.listen()
        if self.listener is None:
            self.stopping.wait(poll_sleep)
            return
        # Notified workers wake at once; polling every POLL_INTERVAL stays as the safety
        # net (and picks up jobs whose run_after has come). Short slices keep a stop
        # signal from waiting out the whole interval.
        deadline = now + float(settings.POLL_INTERVAL)
        recheck = self.listener.heard_at + wakeup.COALESCE
        if recheck > self.claim_began:
            deadline = min(deadline, recheck)  # in the past: claim again at once
        try:
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                if self.listener.wait(min(left, 0.25)):
                    return
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        logger.warning(
            "Worker %s: wake-up listener failed (%s); polling for now",
            self.name,
            exc,
            extra=log_fields("wakeup_error", self.name),
        )
        self.close()

    def close(self) -> None:
        if self.listener is not None:
            wakeup.close_quietly(self.listener)
            self.listener = None
