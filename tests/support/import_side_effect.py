"""A module nothing imports: checking or refusing a task path must never import it.

Importing it leaves a trace, as a hostile module's import-time code would: the file
named by DBQUEUE_SIDE_EFFECT_FILE, when that is set.
"""

import os
from pathlib import Path

_marker = os.environ.get("DBQUEUE_SIDE_EFFECT_FILE")
if _marker:
    Path(_marker).write_text("imported")


def run() -> str:
    return "ran"
