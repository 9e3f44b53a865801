"""Loaded (through PYTHONPATH) by the processes the clock-skew tests start under
libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1: libfaketime 0.9.10 makes
clock_nanosleep() on the real monotonic clock fail with EINVAL, and time.sleep() uses it.
A sleep through select() waits on the kernel's timer instead. (Faking the monotonic
clock too is worse: lock and event timeouts then wait the skew on top.)"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
