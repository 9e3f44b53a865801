"""Jobs that misbehave the ways real ones do. Workers started by tests import them from here."""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import resource
import signal
import time
from pathlib import Path

from django_dbqueue import job


@job
def exit_hard(code: int = 1) -> None:
    os._exit(code)


@job
def segfault() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file per test run
    ctypes.string_at(0)


@job
def raise_system_exit() -> None:
    raise SystemExit(3)


@job
def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


class NotAnException(BaseException):
    """Derives from BaseException only, like SystemExit."""


@job
def raise_base_exception() -> None:
    raise NotAnException("a BaseException of the job's own")


@job
def stuck_in_c() -> None:
    """One PBKDF2 call of 2**31 - 1 iterations: minutes in OpenSSL, deaf to SIGALRM."""
    hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 2**31 - 1)


@job
def hold_gil(seconds: float) -> float:
    """One catastrophically backtracking regex match: about ``seconds`` in C, holding the
    GIL throughout. Its size is worked out from a shorter match on this machine (each extra
    character costs ~1.9 times more); returns how long the long match took."""
    pattern = re.compile(r"(x+x+)+y")
    started = time.monotonic()
    pattern.fullmatch("x" * 22)
    short = max(time.monotonic() - started, 1e-4)
    size = 22 + max(0, math.ceil(math.log(seconds / short) / math.log(1.9)))
    started = time.monotonic()
    pattern.fullmatch("x" * size)
    return time.monotonic() - started


@job
def ignore_alarm(seconds: float) -> None:
    """Sleeps on with SIGALRM blocked: the polite timeout never reaches it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(seconds)


@job
def note(directory: str, key: str) -> str:
    """Append ``key`` to a file of this process: a run counted at no database cost."""
    with open(Path(directory) / f"runs-{os.getpid()}.txt", "a") as out:
        out.write(key + "\n")
    return key


@job
def sleep_past_timeout(seconds: float) -> None:
    """Overruns its timeout in plain Python: SIGALRM stops it."""
    time.sleep(seconds)


@job
def span(directory: str, key: str, seconds: float) -> str:
    """Sleep ``seconds``, then note when this run began and ended (and in which process),
    so a test can see how many jobs ran at once."""
    began = time.time()
    time.sleep(seconds)
    with open(Path(directory) / f"spans-{os.getpid()}.txt", "a") as out:
        out.write(f"{key} {began} {time.time()}\n")
    return key


@job
def python_loop(seconds: float) -> None:
    """Busy in plain Python (short sleeps) for ``seconds``: an interruption raised in its
    thread stops it at once."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


@job
def exit_after(seconds: float, code: int = 1) -> None:
    """Ends its process once ``seconds`` have passed (jobs of other threads running)."""
    time.sleep(seconds)
    os._exit(code)


@job
def segfault_after(seconds: float) -> None:
    """Crashes its process (SIGSEGV) once ``seconds`` have passed: jobs of its other
    threads are running by then."""
    time.sleep(seconds)
    segfault()
