"""A task module whose import lasts as long as a test wants, to stop ``run_jobs`` while it
starts: the supervisor imports it in its task discovery, before it has run.

When ``DBQUEUE_SLOW_START_FILE`` is set, importing it writes that file, then waits until
the test removes it (60 s at most).
"""

import os
import time
from pathlib import Path

_marker = os.environ.get("DBQUEUE_SLOW_START_FILE")
if _marker:
    _path = Path(_marker)
    _path.write_text(str(os.getpid()))
    _deadline = time.monotonic() + 60
    while _path.exists() and time.monotonic() < _deadline:
        time.sleep(0.01)
