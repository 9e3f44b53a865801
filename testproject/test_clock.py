"""A clock the tests can move for every process at once (never used outside the tests).

With ``DBQUEUE_TEST_CLOCK_FILE`` set, ``django.utils.timezone.now()`` is the real time plus
the number of seconds written in that file, re-read when the file changes, so a test can
make all its worker processes' clocks jump together.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta


def install(path: str) -> None:
    from django.utils import timezone

    real_now = timezone.now
    state = {"mtime": -1.0, "offset": timedelta(0)}

    def now() -> datetime:
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return real_now()
        if mtime != state["mtime"]:
            with open(path) as handle:
                text = handle.read().strip()
            state["offset"] = timedelta(seconds=float(text or 0))
            state["mtime"] = mtime
        return real_now() + state["offset"]  # type: ignore[operator]

    timezone.now = now
