"""Jobs the tests enqueue. Workers started by tests import them from here."""

import os
import time

from testproject.models import Execution


def noop() -> None:
    return None


def add(a: int, b: int) -> int:
    return a + b


def record(key: str, sleep: float = 0.0) -> str:
    """Leave a row behind so a test can count how often this job ran."""
    if sleep:
        time.sleep(sleep)
    Execution.objects.create(key=key, pid=os.getpid())
    return key


def fail(message: str = "boom") -> None:
    raise ValueError(message)


def fail_then_record(key: str) -> None:
    Execution.objects.create(key=key, pid=os.getpid())
    raise RuntimeError(f"attempt for {key} failed")


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def unserializable() -> object:
    return object()


class Tasks:
    @staticmethod
    def static_add(a: int, b: int) -> int:
        return a + b
