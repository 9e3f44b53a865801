"""A process that enqueues unique jobs, for the multi-process unique-key test.

Run as ``python -m tests.support.unique_enqueuer <count> <keys>``. It prints ``ready``,
waits for a line on stdin (so every process starts at the same moment), enqueues
``count`` jobs over ``keys`` keys, and prints one JSON line: the ids it got back per key.
"""

from __future__ import annotations

import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()

from django_dbqueue import enqueue  # noqa: E402
from tests.support import jobs  # noqa: E402


def main() -> None:
    count, keys = int(sys.argv[1]), int(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    seen: dict[str, list[int]] = {}
    for i in range(count):
        key = f"key-{(i * 7 + os.getpid()) % keys}"
        seen.setdefault(key, []).append(enqueue(jobs.noop, unique_key=key).pk)
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
