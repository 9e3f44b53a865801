"""The bounds of a job's options and arguments, checked before anything is written.

Shared by ``enqueue()`` and ``@job`` (whose defaults are checked when a module declares
them), so a value a worker cannot act on never reaches the table: a timeout that
``setitimer`` refuses, a delay that overflows ``datetime``, an attempt count the integer
column cannot hold, arguments nested deeper than MariaDB's JSON accepts, text that one
of the databases cannot store (a NUL character, a lone surrogate). Which option each
check bounds is said once, in ``options.py``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django_dbqueue.exceptions import InvalidJob

QUEUE_NAME_MAX = 64  # Job.queue's max_length (tests/test_registry.py holds them equal)
PRIORITY_RANGE = (-32768, 32767)  # a SmallIntegerField
# Attempts are counted in an integer column; far beyond any useful retry policy.
MAX_ATTEMPTS_LIMIT = 1000
# A job running 30 days is not waiting for a timeout; the limit keeps setitimer()'s
# argument well inside what it accepts.
MAX_TIMEOUT = 30 * 86400.0
MAX_RETRY_BACKOFF = 30 * 86400.0
# run_after lies at most this far from now (either way): seconds, timedelta or datetime.
MAX_RUN_AFTER = 100 * 366 * 86400.0
# Levels of lists/dicts inside one argument. The stored args list adds one level, and
# MariaDB's JSON_VALID() refuses documents nested 32 levels deep.
MAX_NESTING = 30


def unknown_options(function: str, given: Iterable[Any], valid: tuple[str, ...]) -> None:
    """Raise TypeError naming ``function`` for options it does not take.

    A TypeError, not InvalidJob: a misspelt option is a mistake in the calling code,
    like any unexpected keyword argument, and must not be caught by handlers that turn
    InvalidJob (bad data) into a message for a user.
    """
    unknown = sorted(name for name in given if name not in valid)
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise TypeError(
        f"{function} got an unexpected option {name!r}{hint} Valid options: {', '.join(valid)}."
    )


def check_text(value: str, name: str) -> str:
    """``value`` if every database can store it: PostgreSQL refuses a NUL character in
    text (a DataError that would abort the caller's transaction), and no database takes
    a lone surrogate, which has no UTF-8 form."""
    if "\x00" in value:
        raise InvalidJob(f"{name} contains a NUL character (\\x00), which PostgreSQL cannot store.")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidJob(
                f"{name} contains a lone surrogate (e.g. '\\ud800'), which has no UTF-8 "
                "form: no database can store it."
            ) from None
    return value


def check_queue_name(queue: Any) -> str:
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidJob("queue must be a non-empty string.")
    if len(queue) > QUEUE_NAME_MAX:
        raise InvalidJob(
            f"queue name {queue[:20]!r}... is longer than {QUEUE_NAME_MAX} characters."
        )
    return check_text(queue, "queue")


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidJob(f"priority must be an integer, not {priority!r}.")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise InvalidJob(f"priority must be between {PRIORITY_RANGE[0]} and {PRIORITY_RANGE[1]}.")
    return priority


def check_max_attempts(max_attempts: Any) -> int:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidJob(
            f"max_attempts must be an integer of at least 1 and at most {MAX_ATTEMPTS_LIMIT}, "
            f"not {max_attempts!r}."
        )
    return max_attempts


def seconds(value: Any, name: str) -> float:
    """``value`` as a finite float; NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(f"{name} must be a number of seconds, not {value!r}.")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise InvalidJob(f"{name} must be a finite number of seconds, not {value!r}.")
    return number


def check_timeout(value: Any) -> float | None:
    if value is None:
        return None
    number = seconds(value, "timeout")
    if not 0 < number <= MAX_TIMEOUT:
        raise InvalidJob(
            f"timeout must be a positive number of seconds of at most {MAX_TIMEOUT:g} "
            f"(30 days), not {value!r}; leave it out for no limit."
        )
    return number


def check_retry_backoff(value: Any) -> float | None:
    if value is None:
        return None
    number = seconds(value, "retry_backoff")
    if not 0 <= number <= MAX_RETRY_BACKOFF:
        raise InvalidJob(
            f"retry_backoff must be a number of seconds from 0 to {MAX_RETRY_BACKOFF:g} "
            f"(30 days), not {value!r}."
        )
    return number


def check_delay(value: float, what: str) -> float:
    if abs(value) > MAX_RUN_AFTER:
        raise InvalidJob(
            f"run_after must lie within {MAX_RUN_AFTER:g} seconds (100 years) of now, not {what}."
        )
    return value


def run_after_time(run_after: datetime | timedelta | float | int | None, now: datetime) -> datetime:
    """When a job enqueued at ``now`` may run: ``run_after`` as a moment, a delay (a
    timedelta or seconds) or None (at once), checked against the bounds.

    A moment is given back in UTC: the same instant, in an offset every database stores
    (PostgreSQL refuses offsets beyond 15:59, such as +23:59, which Python allows).
    """
    if run_after is None:
        return now
    if isinstance(run_after, timedelta):
        check_delay(run_after.total_seconds(), repr(run_after))
        return now + run_after
    if isinstance(run_after, datetime):
        if run_after.utcoffset() is None:
            raise InvalidJob("run_after must be timezone-aware (use django.utils.timezone.now()).")
        try:
            delay = (run_after - now).total_seconds()
        except OverflowError:
            delay = MAX_RUN_AFTER * 2
        check_delay(delay, run_after.isoformat())
        return run_after if run_after.tzinfo is UTC else run_after.astimezone(UTC)
    if isinstance(run_after, int | float) and not isinstance(run_after, bool):
        delay = check_delay(seconds(run_after, "run_after"), repr(run_after))
        return now + timedelta(seconds=delay)
    raise InvalidJob(f"run_after must be a datetime, timedelta or seconds, not {run_after!r}.")


def check_nesting(value: list[Any] | dict[str, Any], what: str) -> None:
    """Refuse arguments nested deeper than :data:`MAX_NESTING` levels.

    Walks with a stack, not recursion, so any depth is refused without a RecursionError.
    Only containers are pushed, so flat arguments cost one pass.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        current, depth = stack.pop()
        items = current.values() if isinstance(current, dict) else current
        for item in items:
            if isinstance(item, list | tuple | dict):
                if depth + 1 > MAX_NESTING:
                    raise too_deep(what)
                stack.append((item, depth + 1))


# A NUL character, escaped in JSON text (json.dumps escapes it, as it does every
# control character): \u0000 after an even number of backslashes.
JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def has_nul(json_text: str) -> bool:
    """Does this JSON text hold a NUL character (which PostgreSQL cannot store)?"""
    return "\\u0000" in json_text and JSON_NUL.search(json_text) is not None


def too_deep(what: str) -> InvalidJob:
    return InvalidJob(
        f"Job {what} are nested deeper than {MAX_NESTING} levels of lists and dicts. Pass "
        "flatter data (or an id to look the data up)."
    )


# Jobs of one concurrency key that may be claimed at once; more is a pool, not a key.
MAX_CONCURRENCY_LIMIT = 1000


def check_concurrency_key(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 255:
        raise InvalidJob("concurrency_key must be a string of 1 to 255 characters.")
    return check_text(value, "concurrency_key")


def check_unique_key(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 255:
        raise InvalidJob("unique_key must be a string of 1 to 255 characters.")
    return check_text(value, "unique_key")


def check_concurrency_limit(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob("concurrency_limit must be a whole number.")
    if not 1 <= value <= MAX_CONCURRENCY_LIMIT:
        raise InvalidJob(f"concurrency_limit must be between 1 and {MAX_CONCURRENCY_LIMIT}.")
    return value


MAX_DEPENDENCIES = 1000
DEPENDENCY_FAILURE_RULES = ("cancel", "run")


def check_depends_on(value: Any) -> list[int]:
    """Jobs or job ids, at most MAX_DEPENDENCIES: their ids, sorted, without repeats."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidJob("depends_on must be a list of jobs or job ids.")
    ids = set()
    for item in value:
        job_id = getattr(item, "pk", item)
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise InvalidJob(f"depends_on: {item!r} is neither a saved job nor a job id.")
        ids.add(job_id)
    if len(ids) > MAX_DEPENDENCIES:
        raise InvalidJob(f"depends_on takes at most {MAX_DEPENDENCIES} jobs.")
    return sorted(ids)


def check_on_dependency_failure(value: Any) -> str:
    if value not in DEPENDENCY_FAILURE_RULES:
        raise InvalidJob("on_dependency_failure must be 'cancel' or 'run'.")
    return str(value)
