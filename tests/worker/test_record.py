"""What the queue shows is what happened (issue 24), in process and thread mode alike:
each job's own start and end times, results written while other jobs run on, no job
held behind busy lanes while another lane is idle, running jobs visible, innocent jobs
never failed for a neighbour's crash, and what run_jobs says when told to stop. Real
processes, real signals."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.admin.dashboard import worker_rows
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from testproject.models import Execution
from tests.support import CURRENT_DB, Processes, jobs, task_functions, wait_until
from tests.worker import hostile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
EnvMaker = Callable[..., dict[str, str]]

# Process mode: each job alone in its process (--threads 1); thread mode: --threads 2.
MODES = {"process": ["--threads", "1"], "threads": ["--threads", "2"]}
SETTINGS = {
    "LEASE_TIMEOUT": 600,  # only the supervisor's own settling frees a job in time
    "HEARTBEAT_INTERVAL": 0.3,
    "POLL_INTERVAL": 0.2,
    "KILL_GRACE": 1,
    "RETRY_BACKOFF": 0.1,
    "RETRY_JITTER": 0,
}


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest) -> list[str]:
    return MODES[request.param]


@pytest.fixture
def worker_env(worker_env: EnvMaker) -> EnvMaker:
    """Workers without coverage.py's tracer (see tests/worker/test_threads.py)."""

    def make(**settings: object) -> dict[str, str]:
        env = worker_env(**{**SETTINGS, **settings})
        for name in ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START"):
            env.pop(name, None)
        return env

    return make


def statuses(batch: list[Job]) -> set[str]:
    return set(
        Job.objects.filter(pk__in=[job.pk for job in batch]).values_list("status", flat=True)
    )


def gated(gate: Path, prefix: str, count: int) -> list[Job]:
    """``count`` jobs that run until ``gate`` exists, each noting its start (``prefix`` i)."""
    return enqueue_many(
        {"task": jobs.hold_until, "args": [str(gate), f"{prefix}{i}"]} for i in range(count)
    )


def stop(proc: object, sig: signal.Signals = signal.SIGTERM) -> str:
    proc.send_signal(sig)  # type: ignore[attr-defined]
    out, _ = proc.communicate(timeout=120)  # type: ignore[attr-defined]
    assert proc.returncode == 0, out  # type: ignore[attr-defined]
    return str(out)


# -- 1. results written when jobs end, with their own times -----------------------------


def test_quick_jobs_are_recorded_while_a_long_one_runs_with_their_own_times(
    processes: Processes, worker_env: EnvMaker, mode: list[str], tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    quick = enqueue_many({"task": jobs.record, "args": [f"q{i}"]} for i in range(5))
    slow = enqueue(jobs.hold_until, [str(gate), "slow"])
    proc = processes.run_jobs(*mode, env=worker_env())
    wait_until(lambda: Execution.objects.filter(key="slow").exists(), timeout=120)
    # The long job runs (and holds until the gate opens): the quick ones are written now.
    wait_until(lambda: statuses(quick) == {Job.Status.DONE}, timeout=60)
    assert Job.objects.get(pk=slow.pk).status == Job.Status.CLAIMED
    gate.touch()
    wait_until(lambda: Job.objects.get(pk=slow.pk).status == Job.Status.DONE, timeout=60)
    stop(proc)
    rows = {job.pk: Job.objects.get(pk=job.pk) for job in [*quick, slow]}
    ran = {e.key: e.created_at for e in Execution.objects.all()}
    for job in quick:
        row = rows[job.pk]
        assert row.started_at is not None and row.finished_at is not None
        # Its own end: after its code ran, and before the slow job (which ended last)
        # was even let go; a batched write's time would be the slow job's end.
        assert row.started_at <= ran[job.args[0]] <= row.finished_at
        assert row.finished_at < rows[slow.pk].finished_at
    if mode == MODES["process"]:
        # One lane: each job starts after the one before it ended, to the millisecond.
        ordered = sorted((rows[job.pk] for job in [*quick, slow]), key=lambda r: r.started_at)
        for before, after in itertools.pairwise(ordered):
            assert before.finished_at <= after.started_at


def test_get_result_of_a_finished_task_is_not_held_back_by_a_running_one(
    processes: Processes, worker_env: EnvMaker, mode: list[str], tmp_path: Path
) -> None:
    from django_dbqueue.tasks.compat import TaskResultStatus

    gate = tmp_path / "open"
    done = [task_functions.add.enqueue(i, 1) for i in range(3)]
    held = task_functions.hold.enqueue(str(gate))
    proc = processes.run_jobs(*mode, env=worker_env())
    try:
        wait_until(
            lambda: task_functions.hold.get_result(held.id).started_at is not None, timeout=120
        )
        running = task_functions.hold.get_result(held.id)
        assert running.status == TaskResultStatus.RUNNING
        for result in done:
            fetched = wait_until(
                lambda r=result: (got := task_functions.add.get_result(r.id)).is_finished and got,
                timeout=60,
            )
            assert fetched.status == TaskResultStatus.SUCCESSFUL
            assert fetched.started_at <= fetched.finished_at
        assert task_functions.hold.get_result(held.id).status == TaskResultStatus.RUNNING
    finally:
        gate.touch()
    wait_until(lambda: task_functions.hold.get_result(held.id).is_finished, timeout=60)
    stop(proc)


# -- 2. no job held behind busy lanes ---------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [["--concurrency", "2", "--threads", "2"], ["--concurrency", "3", "--threads", "1"]],
    ids=["2x2-threads", "3-processes"],
)
def test_no_quick_job_waits_behind_long_ones_while_a_lane_is_idle(
    processes: Processes, worker_env: EnvMaker, layout: list[str], tmp_path: Path
) -> None:
    """Two long jobs among 20 quick ones, enqueued together (the issue's case): every
    quick job is done while both long ones still run; none was held behind them."""
    gate = tmp_path / "open"
    first = enqueue_many({"task": jobs.record, "args": [f"a{i}"]} for i in range(6))
    long = gated(gate, "L", 2)
    rest = enqueue_many({"task": jobs.record, "args": [f"b{i}"]} for i in range(14))
    quick = first + rest
    proc = processes.run_jobs(*layout, "--batch-size", "50", env=worker_env())
    try:
        wait_until(lambda: statuses(quick) == {Job.Status.DONE}, timeout=120)
        # Both long jobs still run: no quick job waited for one of them to end.
        assert statuses(long) == {Job.Status.CLAIMED}
        # And they run side by side: one claimed behind the other is handed back within
        # the stale interval and started by an idle lane (on a loaded machine the quick
        # jobs can all be done before that hand-back).
        started = Execution.objects.filter(key__startswith="L")
        wait_until(lambda: started.count() == 2, timeout=60)
        assert statuses(long) == {Job.Status.CLAIMED}
    finally:
        gate.touch()
    wait_until(lambda: statuses(long) == {Job.Status.DONE}, timeout=60)
    stop(proc)
    assert Execution.objects.filter(key__in=[j.args[0] for j in quick]).count() == 20


# -- 3. running jobs visible ------------------------------------------------------------


def test_running_jobs_show_their_start_in_the_job_the_workers_page_and_dashboard(
    processes: Processes, worker_env: EnvMaker, mode: list[str], tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    lanes = int(mode[-1])
    held = gated(gate, "h", lanes)
    proc = processes.run_jobs(*mode, env=worker_env())
    try:
        wait_until(lambda: Execution.objects.count() == lanes, timeout=120)
        ids = {job.pk for job in held}
        # Within a heartbeat of SHOW_AFTER: every running job has its start ...
        wait_until(
            lambda: not Job.objects.filter(pk__in=ids, started_at__isnull=True).exists(),
            timeout=30,
        )
        for row in Job.objects.filter(pk__in=ids):
            assert row.status == Job.Status.CLAIMED and row.started_at is not None
        # ... and its worker's row names one of them, with its start.
        child = wait_until(
            lambda: WorkerRow.objects.filter(
                role=WorkerRow.Role.CHILD, running_job_id__in=ids
            ).first(),
            timeout=30,
        )
        assert child.running_since is not None
        shown = Job.objects.get(pk=child.running_job_id)
        assert abs((child.running_since - shown.last_attempted_at).total_seconds()) < 0.01
        rows = [row for row in worker_rows(timezone.now()) if row.worker.name == child.name]
        assert rows and rows[0].running_for is not None and rows[0].running_label
    finally:
        gate.touch()
    wait_until(lambda: statuses(held) == {Job.Status.DONE}, timeout=60)
    stop(proc)


# -- 4. a crash is charged to the job that caused it ------------------------------------


@pytest.mark.parametrize("threads", ["4", "1"], ids=["threads", "process"])
def test_a_segfault_among_innocent_jobs_fails_only_the_crashing_job(
    processes: Processes, worker_env: EnvMaker, threads: str
) -> None:
    # First in claim order: it runs beside the first innocent jobs and crashes them all.
    hostile_job = enqueue(hostile.segfault_after, [0.3], max_attempts=3)
    innocent = enqueue_many({"task": jobs.record, "args": [f"i{i}", 0.8]} for i in range(12))
    concurrency = "1" if threads == "4" else "2"
    proc = processes.run_jobs(
        "--threads", threads, "--concurrency", concurrency, env=worker_env(CLAIM_AHEAD=0)
    )
    wait_until(lambda: Job.objects.get(pk=hostile_job.pk).status == Job.Status.FAILED, timeout=180)
    wait_until(lambda: statuses(innocent) == {Job.Status.DONE}, timeout=180)
    stop(proc)
    bad = Job.objects.get(pk=hostile_job.pk)
    assert bad.attempts == 3, bad.errors
    assert "signal 11 (SIGSEGV)" in bad.last_error
    charged = [e for e in bad.errors if "none is charged" not in e["traceback"]]
    assert len(charged) == 3  # its own crashes, each when it ran alone
    for job in innocent:
        row = Job.objects.get(pk=job.pk)
        assert row.status == Job.Status.DONE
        assert row.attempts == 1, row.errors  # a crash beside it cost it nothing
        for error in row.errors:
            assert "none is charged" in error["traceback"] and str(bad.pk) in error["traceback"]
        # record() writes its row after its sleep: each innocent job ran to its end once.
        assert Execution.objects.filter(key=job.args[0]).count() == 1


# -- 5. stopping ------------------------------------------------------------------------


def read_until(proc: object, wanted: Callable[[str], bool], lines: list[str]) -> str:
    """Read the process's output line by line until a line matches (kept in ``lines``)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[attr-defined]
        if not line:
            raise AssertionError("output ended:\n" + "".join(lines))
        lines.append(line)
        if wanted(line):
            return line
    raise AssertionError("".join(lines))


def test_first_stop_signal_says_what_finishes_and_what_is_handed_back(
    processes: Processes, worker_env: EnvMaker, mode: list[str], tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    lanes = int(mode[-1])
    batch = gated(gate, "s", lanes + 3)
    proc = processes.run_jobs(*mode, "--batch-size", str(lanes + 3), env=worker_env(CLAIM_AHEAD=0))
    wait_until(lambda: Execution.objects.count() == lanes, timeout=120)
    wait_until(lambda: statuses(batch) == {Job.Status.CLAIMED}, timeout=30)
    proc.send_signal(signal.SIGINT)
    lines: list[str] = []
    line = read_until(proc, lambda text: "stopping" in text, lines)
    assert f"stopping: finishing {lanes} running jobs, handing back 3 (SIGINT" in line
    gate.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert ("".join(lines) + out).count("stopping: finishing") == 1, "one line"
    assert Job.objects.filter(status=Job.Status.DONE).count() == lanes
    assert Job.objects.filter(status=Job.Status.QUEUED, attempts=0).count() == 3


def test_second_stop_signal_is_named_as_the_signal_it_was(
    processes: Processes, worker_env: EnvMaker, mode: list[str]
) -> None:
    lanes = int(mode[-1])
    batch = enqueue_many({"task": hostile.python_loop, "args": [60]} for _ in range(lanes))
    proc = processes.run_jobs(*mode, env=worker_env(CLAIM_AHEAD=0))
    wait_until(lambda: statuses(batch) == {Job.Status.CLAIMED}, timeout=120)
    wait_until(
        lambda: not Job.objects.filter(status=Job.Status.CLAIMED, started_at=None).exists(),
        timeout=30,
    )
    lines: list[str] = []
    proc.send_signal(signal.SIGINT)
    read_until(proc, lambda text: "stopping:" in text, lines)
    proc.send_signal(signal.SIGINT)
    read_until(proc, lambda text: "stopping now" in text, lines)
    assert "a second SIGINT" in lines[-1]
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    for job in batch:
        row = Job.objects.get(pk=job.pk)
        assert (row.status, row.attempts) == (Job.Status.QUEUED, 1), row.last_error
        assert "stopped by a second signal (SIGINT)" in row.last_error
        assert "SIGTERM" not in row.last_error


def test_an_unreachable_database_at_start_is_named_each_retry_and_ctrl_c_exits_1(
    processes: Processes, worker_env: EnvMaker, tmp_path: Path
) -> None:
    env = worker_env()
    if CURRENT_DB == "sqlite":
        env["DBQUEUE_DB_NAME"] = str(tmp_path / "missing" / "db.sqlite3")
        where = str(tmp_path / "missing" / "db.sqlite3")
    else:
        env["MYSQL_PORT" if CURRENT_DB == "mysql" else "PGPORT"] = "1"  # nothing listens
        where = "127.0.0.1:1"
    proc = processes.run_jobs(env=env)
    lines: list[str] = []
    for _ in range(2):
        line = read_until(proc, lambda text: "unreachable" in text, lines)
        assert f"database 'default' at {where} is unreachable (" in line
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    text = "".join(lines) + out
    assert proc.returncode == 1, text
    assert "Traceback" not in text
    assert "waiting for jobs" not in text, "nothing said about jobs before the database"


def test_burst_runs_the_ticks_it_enqueued_before_it_exits(
    processes: Processes, worker_env: EnvMaker, mode: list[str]
) -> None:
    schedule = {"beat": {"task": "tests.support.jobs.record", "every": 1, "args": ["tick"]}}
    enqueue_many({"task": jobs.sleep, "args": [0.5]} for _ in range(4))
    proc = processes.run_jobs(*mode, "--burst", env=worker_env(SCHEDULE=schedule))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    ticks = Job.objects.filter(task="tests.support.jobs.record")
    assert ticks.exists()
    assert set(ticks.values_list("status", flat=True)) == {Job.Status.DONE}, out
    assert Execution.objects.filter(key="tick").count() == ticks.count()


def test_burst_ends_though_its_ticks_go_to_a_queue_it_does_not_drain(
    processes: Processes, worker_env: EnvMaker, mode: list[str]
) -> None:
    # The ticks land in "reports"; this run drains "default" only: it must not wait for
    # them (it used to start children for them for ever).
    schedule = {
        "beat": {"task": "tests.support.jobs.record", "every": 1, "args": ["t"], "queue": "reports"}
    }
    enqueue_many({"task": jobs.sleep, "args": [0.5]} for _ in range(4))
    env = worker_env(SCHEDULE=schedule)
    proc = processes.run_jobs(*mode, "--burst", "--queue", "default", env=env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert Job.objects.filter(queue="default", status=Job.Status.DONE).count() == 4
    assert not Job.objects.filter(queue="reports").exclude(status=Job.Status.QUEUED).exists()
