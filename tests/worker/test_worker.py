from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.worker import rows
from django_dbqueue.worker.loop import Worker
from testproject.models import Execution
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def drain(**kwargs: object) -> Worker:
    worker = Worker(burst=True, handle_signals=False, **kwargs)  # type: ignore[arg-type]
    worker.run()
    return worker


def test_worker_runs_jobs_and_stores_results() -> None:
    ok = enqueue(jobs.add, [2, 3])
    rec = enqueue(jobs.record, ["a"])
    worker = drain()
    ok.refresh_from_db()
    rec.refresh_from_db()
    assert (ok.status, ok.result) == (Job.Status.DONE, 5)
    assert rec.status == Job.Status.DONE
    assert ok.finished_at is not None and ok.started_at is not None
    assert ok.owner == worker.name
    assert Execution.objects.filter(key="a").count() == 1
    assert worker.stats.done == 2
    assert not WorkerRow.objects.exists(), "a worker that exits deregisters"


def test_failing_job_with_one_attempt_ends_failed_with_traceback() -> None:
    job = enqueue(jobs.fail, ["kaput"], max_attempts=1)
    after = enqueue(jobs.add, [1, 1])
    worker = drain()
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert "ValueError: kaput" in job.last_error
    assert "Traceback" in job.last_error
    assert job.errors[-1]["exception_class_path"] == "builtins.ValueError"
    assert Job.objects.get(pk=after.pk).status == Job.Status.DONE
    assert (worker.stats.failed, worker.stats.done) == (1, 1)


def test_failed_attempt_is_retried_later_with_backoff() -> None:
    job = enqueue(jobs.fail, max_attempts=3, retry_backoff=60)
    before = timezone.now()
    worker = drain()
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED
    assert job.attempts == 1
    # 60 s with at most 20% jitter either way
    assert before + timedelta(seconds=47) <= job.run_after <= before + timedelta(seconds=73)
    assert worker.stats.retried == 1


def test_task_that_is_no_longer_registered_fails_at_once_and_worker_goes_on() -> None:
    # max_attempts=3: no retry can register a task, so the first attempt is the last.
    gone = Job.objects.create(task="tests.support.jobs.removed_in_last_release", max_attempts=3)
    module_gone = Job.objects.create(task="deleted_app.tasks.work", max_attempts=3)
    ok = enqueue(jobs.add, [1, 2])
    drain()
    for job in (gone, module_gone):
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.FAILED, 1)
        assert f"task {job.task!r} is not a registered task" in job.last_error
    assert Job.objects.get(pk=ok.pk).result == 3


def test_unserializable_result_is_a_clear_failure() -> None:
    job = enqueue(jobs.unserializable, max_attempts=1)
    drain()
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert "not JSON-serializable" in job.last_error


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("deep", "nested deeper than 30 levels"),
        ("nul", "holding a NUL character"),
        ("huge", "over MAX_PAYLOAD_BYTES"),
    ],
)
def test_a_result_no_database_could_store_fails_its_job_alone(kind: str, why: str) -> None:
    bad = enqueue(jobs.hostile_result, [kind], max_attempts=1)
    good = [enqueue(jobs.add, [i, 1]) for i in range(3)]
    fine = enqueue(jobs.hostile_result, ["fine"])
    drain()
    bad.refresh_from_db()
    assert bad.status == Job.Status.FAILED
    assert why in bad.last_error and "ResultNotSerializable" in bad.last_error
    assert {j.status for j in Job.objects.filter(pk__in=[g.pk for g in good])} == {"done"}
    fine.refresh_from_db()
    assert fine.result == {"nested": {"deeply": [1, 2, 3]}}


def test_max_jobs_and_queue_selection() -> None:
    for _ in range(5):
        enqueue(jobs.noop)
    other = enqueue(jobs.noop, queue="emails")
    worker = drain(max_jobs=3, queues=["default"])
    assert worker.stats.done == 3
    assert Job.objects.filter(status=Job.Status.DONE).count() == 3
    assert Job.objects.get(pk=other.pk).status == Job.Status.QUEUED


def test_run_jobs_command_prints_progress(capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(20):
        enqueue(jobs.add, [i, 1])
    enqueue(jobs.fail, max_attempts=1)
    call_command("run_jobs", "--burst", "--batch-size", "7")
    out = capsys.readouterr().out
    assert "Finished: 20 done, 1 failed, 0 retried" in out
    assert "jobs/s" in out
    assert Job.objects.filter(status=Job.Status.DONE).count() == 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be at least 1"),
        (["--batch-size", "many"], "expected a whole number"),
        (["--max-jobs", "-3"], "must be at least 1"),
        (["--queue", "nope"], "Unknown queue"),
        (["--progress-interval", "0"], "greater than 0"),
    ],
)
def test_run_jobs_rejects_bad_options(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("run_jobs", "--burst", *args)


def test_registering_a_process_again_after_a_lost_reply_keeps_its_one_row() -> None:
    first = rows.register("host:1:abc", 1, WorkerRow.Role.CHILD, ["default"], "sup")
    # The retry of an INSERT whose reply was lost: the row is there already.
    again = rows.register("host:1:abc", 1, WorkerRow.Role.CHILD, ["default"], "sup")
    assert again.pk == first.pk
    assert WorkerRow.objects.filter(name="host:1:abc").count() == 1


def test_a_stop_signal_landing_while_the_main_thread_holds_the_stop_lock_goes_through() -> None:
    """A signal handler runs in the main thread, maybe just as Event.wait() took back its
    lock: setting a plain Event there waited for itself, and the worker never stopped
    (seen in CI: a run_jobs child hung in Worker._on_signal). No database needed."""

    def hung(signum: int, frame: object) -> None:
        raise AssertionError("the stop signal's handler deadlocked on the stop event")

    worker = Worker(name="signalled", handle_signals=True)
    previous = worker._install_signals()
    alarm = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)  # a deadlocked lock acquire is interrupted by this one
    try:
        with worker.stopping._cond:  # type: ignore[attr-defined]  # as inside wait()
            signal.raise_signal(signal.SIGTERM)
        assert worker.stopping.is_set()
        assert worker._stopped_by == "SIGTERM"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, alarm)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
