"""Jobs the tests enqueue, registered with @job; DBQUEUE['TASK_MODULES'] lists this module
(tests/ is not an installed app), so the workers tests start find them too."""

import asyncio
import os
import time
from datetime import UTC

from django.db import connection

from django_dbqueue import job
from testproject.models import Execution


@job
def noop(*args: object, **kwargs: object) -> None:
    """Takes any arguments: the tests' carrier of payloads that are only stored."""
    return None


@job
def add(a: int, b: int) -> int:
    return a + b


@job
def record(key: str, sleep: float = 0.0) -> str:
    """Leave a row behind so a test can count how often this job ran."""
    if sleep:
        time.sleep(sleep)
    Execution.objects.create(key=key, pid=os.getpid())
    return key


@job
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@job
def fail_then_record(key: str) -> None:
    Execution.objects.create(key=key, pid=os.getpid())
    raise RuntimeError(f"attempt for {key} failed")


@job
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@job
def hold_until(path: str, key: str, limit: float = 60) -> None:
    """Record that this job started, then wait (at most ``limit`` s) until ``path`` exists:
    a gate that lets a test hold workers until all of them are running."""
    Execution.objects.create(key=key, pid=os.getpid())
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@job
def unserializable() -> object:
    return object()


@job
def hostile_result(kind: str) -> object:
    """Return something no database should be asked to store."""
    if kind == "deep":
        value: list[object] = []
        for _ in range(40):
            value = [value]
        return value
    if kind == "nul":
        return "a\x00b"
    if kind == "huge":
        return "x" * 2_000_000
    return {"nested": {"deeply": [1, 2, 3]}}


class Tasks:
    @staticmethod
    @job
    def static_add(a: int, b: int) -> int:
        return a + b


@job
def retry_once(key: str) -> str:
    """Ask to be run again later the first time, succeed the second time."""
    from django_dbqueue.exceptions import RetryJob

    if not Execution.objects.filter(key=key).exists():
        Execution.objects.create(key=key, pid=os.getpid())
        raise RetryJob(0.3, "the upstream service said: come back later")
    return key


@job
def lock_own_row_then_return(job_id: int, hold: float) -> str:
    """Hold a row lock on this job from another connection while the worker records it."""
    import threading

    from django.db import connection, transaction

    from django_dbqueue.models import Job

    locked = threading.Event()

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(pk=job_id))
                locked.set()
                time.sleep(hold)
        finally:
            connection.close()

    threading.Thread(target=hold_lock, daemon=True).start()
    locked.wait(10)
    return "recorded after the lock was released"


@job(concurrency_key="probe:{0}", concurrency_limit=1)
def keyed_probe(key: str, n: int, fail_first: bool = False) -> None:
    """Record when this run started and ended; with fail_first, the first run fails."""
    Execution.objects.create(key=f"start:{key}:{n}", pid=os.getpid())
    time.sleep(0.02)
    failing = fail_first and not Execution.objects.filter(key=f"failed:{key}:{n}").exists()
    if failing:
        Execution.objects.create(key=f"failed:{key}:{n}", pid=os.getpid())
    Execution.objects.create(key=f"end:{key}:{n}", pid=os.getpid())
    if failing:
        raise RuntimeError(f"first run of {key}:{n} fails")


@job
def mark(directory: str, n: int) -> None:
    """Append ``n`` to a file of this process in ``directory``: who ran what, how often,
    with no statement of its own (the scale tests count the server's statements)."""
    with open(os.path.join(directory, f"marks-{os.getpid()}.txt"), "a") as out:
        out.write(f"{n}\n")


@job
def slot_probe(directory: str, key: str, n: int, fail_first: bool = False) -> None:
    """Append this run's start and end (monotonic ns, pid) to a file of this process.

    With ``fail_first`` the first run of (key, n) fails after recording its end: the
    marker file is created with O_EXCL, so exactly one run sees it missing.
    """
    path = os.path.join(directory, f"runs-{os.getpid()}.txt")
    with open(path, "a") as out:
        out.write(f"start {key} {n} {time.monotonic_ns()} {os.getpid()}\n")
        out.flush()
        time.sleep(0.001)
        failing = False
        if fail_first:
            try:
                marker = os.path.join(directory, f"failed-{key}-{n}")
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                failing = True
            except FileExistsError:
                pass
        out.write(f"end {key} {n} {time.monotonic_ns()} {os.getpid()}\n")
    if failing:
        raise RuntimeError(f"first run of {key}:{n} fails")


# -- async def jobs (docs/async.md) ------------------------------------------------------

# How many async_crowd jobs this process runs now, and the most it ran at once.
_crowd = {"running": 0, "peak": 0}


@job
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@job
async def async_record(key: str, sleep: float = 0.0) -> str:
    """record() for the event loop: the row is written through Django's async ORM."""
    if sleep:
        await asyncio.sleep(sleep)
    await Execution.objects.acreate(key=key, pid=os.getpid())
    return key


@job
async def async_sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@job
async def async_crowd(wanted: int, seconds: float) -> int:
    """A barrier: wait (at most a minute) until ``wanted`` of these have run at once in
    this process, then sleep ``seconds``; returns the most that ran at once so far."""
    _crowd["running"] += 1
    _crowd["peak"] = max(_crowd["peak"], _crowd["running"])
    try:
        deadline = time.monotonic() + 60
        while _crowd["peak"] < wanted and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(seconds)
        return _crowd["peak"]
    finally:
        _crowd["running"] -= 1


@job
async def async_hold_until(path: str, key: str) -> None:
    """hold_until() for the event loop: a gate the test opens by creating ``path``."""
    await Execution.objects.acreate(key=key, pid=os.getpid())
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


@job
async def async_block(seconds: float) -> None:
    """Blocks the event loop itself (a hostile async job): no asyncio timeout reaches it."""
    time.sleep(seconds)


@job
async def async_raise(kind: str) -> None:
    if kind == "exit":
        raise SystemExit(3)
    if kind == "timeout":
        raise TimeoutError("the job's own timeout")
    raise ValueError(kind)


_strays: set[asyncio.Task[None]] = set()


@job
async def async_stray_exit() -> str:
    """Starts a task of its own that raises SystemExit (which asyncio lets out of the
    loop), then finishes its own work."""

    async def leave() -> None:
        raise SystemExit(4)

    stray = asyncio.get_running_loop().create_task(leave())
    _strays.add(stray)
    stray.add_done_callback(_strays.discard)
    await asyncio.sleep(0.2)
    return "survived"


@job
def database_time() -> str:
    """The database server's clock when this job ran, in UTC (ISO 8601), read fresh:
    lets a test tell whether a job ran before its ``run_after`` by the database's clock,
    whatever the clock of the host that ran it."""
    sql = "SELECT UTC_TIMESTAMP(6)" if connection.vendor == "mysql" else "SELECT clock_timestamp()"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value = cursor.fetchone()[0]
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


@job
def visible_at_run(key: str) -> None:
    """Record whether the row its enqueuing transaction wrote beside it (``app:<key>``)
    is visible where and when the job runs: ``ran:<key>`` if it is, ``blind:<key>`` if not."""
    seen = Execution.objects.filter(key=f"app:{key}").exists()
    Execution.objects.create(key=f"{'ran' if seen else 'blind'}:{key}", pid=os.getpid())
