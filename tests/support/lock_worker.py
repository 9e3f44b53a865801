"""A process that contends for a named lock, for the multi-process lock tests.

Run as ``python -m tests.support.lock_worker '<json params>'``. It prints ``ready``, waits for a
line on stdin (so every process starts contending at the same moment), then prints one
JSON line per acquisition: when it got and gave back the lock, its fencing token and the
value it drew from the shared counter.

With ``barrier`` (a directory) and ``meet`` (a number), each process's first acquisition
waits, while holding the lock, until ``meet`` holders have arrived: a semaphore's holders
then overlap for certain, whatever the machine's load.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()

from django_dbqueue.locks import named_lock, next_counter_value  # noqa: E402
from django_dbqueue.locks.redis import redis_client  # noqa: E402
from django_dbqueue.models import Counter  # noqa: E402


def read_modify_write(backend: str, key: str) -> None:
    """The racy update the lock must protect: read, pause, write back plus one."""
    if backend == "redis":
        client = redis_client()
        value = int(client.get(key) or 0)
        time.sleep(0.005)
        client.set(key, value + 1)
    else:
        value = Counter.objects.get(name=key).value
        time.sleep(0.005)
        Counter.objects.filter(name=key).update(value=value + 1)


def meet_while_holding(directory: str, count: int) -> None:
    """Arrive at the file barrier in ``directory`` and wait for ``count`` arrivals."""
    Path(directory, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(directory)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(os.listdir(directory))} of {count} holders met")
        time.sleep(0.01)


def main(params: dict[str, Any]) -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    backend = params["backend"]
    for iteration in range(params["iterations"]):
        guard: Any = (
            named_lock(params["name"], backend=backend, limit=params["limit"], fencing=True)
            if params["lock"]
            else nullcontext()
        )
        with guard as lock:
            start = time.time()
            if params.get("barrier") and iteration == 0:
                meet_while_holding(params["barrier"], params["meet"])
            if params["increment"]:
                read_modify_write(backend, params["key"])
            else:
                time.sleep(params["hold"])
            end = time.time()
        drawn = next_counter_value(params["counter"], backend=params["counter_backend"])
        token = lock.fencing_token if lock is not None else None
        print(json.dumps({"start": start, "end": end, "token": token, "drawn": drawn}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
