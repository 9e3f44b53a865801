"""Keeps a lease alive from a background thread while its holder works."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from django_dbqueue.exceptions import LockLost, LockNotHeld

if TYPE_CHECKING:
    from django_dbqueue.locks.base import BaseLock

logger = logging.getLogger("django_dbqueue.locks")


class AutoRenew:
    """Extends ``lock`` every ``interval`` seconds until stopped or until the lease is
    found lost (then :meth:`BaseLock.mark_lost` has set ``lock.lost`` and called the
    holder's ``on_lost`` callback, from this thread)."""

    def __init__(self, lock: BaseLock, interval: float) -> None:
        self.lock = lock
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self.run, name=f"dbqueue-lock-renew:{lock.name[:40]}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.lock.extend()
            except (LockLost, LockNotHeld):
                return
            except Exception:
                # A network blip is not a lost lock: try again until the lease itself
                # is gone, which extend() then reports as LockLost.
                logger.exception("Could not renew lock %r; retrying.", self.lock.name)

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
