"""Paused queues: the switch, the command, and what a worker claims."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_dbqueue import enqueue
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job, QueueState
from django_dbqueue.queue import pausing
from django_dbqueue.worker.loop import Worker
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("dbqueue_queue", *args, stdout=out)
    return out.getvalue()


def test_pause_and_resume_report_whether_they_changed_anything() -> None:
    assert pausing.pause("emails", by="ops") is True
    assert pausing.pause("emails") is False
    assert pausing.paused_queues() == {"emails"}
    assert QueueState.objects.get(name="emails").changed_by == "ops"
    assert pausing.resume("emails") is True
    assert pausing.resume("emails") is False
    assert pausing.paused_queues() == set()


def test_resuming_a_queue_never_paused_changes_nothing() -> None:
    assert pausing.resume("reports") is False
    assert pausing.paused_queues() == set()


def test_unknown_queue_is_refused_and_nothing_is_written() -> None:
    with pytest.raises(InvalidJob, match="Unknown queue 'emails2'"):
        pausing.pause("emails2")
    assert not QueueState.objects.exists()


def test_command_pauses_lists_and_resumes() -> None:
    waiting = enqueue(jobs.add, args=[1, 2], queue="emails")
    assert run("pause", "emails") == "Queue 'emails' is now paused.\n"
    assert run("pause", "emails") == "Queue 'emails' was already paused.\n"
    lines = run("list").splitlines()
    assert lines[0].split() == ["queue", "state", "queued", "running", "lag"]
    rows = [line.split() for line in lines[1:]]
    assert [row[:5] for row in rows] == [
        ["default", "running", "0", "0", "-"],
        ["emails", "paused", "1", "0", rows[1][4]],
        ["reports", "running", "0", "0", "-"],
    ]
    assert float(rows[1][4]) >= 0 and rows[1][5:] == ["s", "(job", f"#{waiting.pk})"]
    assert run("resume", "emails") == "Queue 'emails' is now running.\n"


def test_command_errors_are_one_line() -> None:
    with pytest.raises(CommandError, match=r"^Unknown queue 'nope'"):
        run("pause", "nope")
    with pytest.raises(CommandError, match="Name the queue to pause"):
        run("pause")


def test_enqueue_into_a_paused_queue_works_and_the_worker_leaves_it_alone() -> None:
    pausing.pause("emails")
    waiting = enqueue(jobs.add, args=[1, 2], queue="emails")
    other = enqueue(jobs.add, args=[3, 4], queue="default")

    stats = Worker(burst=True, handle_signals=False).run()

    assert stats.done == 1
    assert Job.objects.get(pk=other.pk).status == Job.Status.DONE
    assert Job.objects.get(pk=waiting.pk).status == Job.Status.QUEUED

    pausing.resume("emails")
    Worker(burst=True, handle_signals=False).run()
    assert Job.objects.get(pk=waiting.pk).status == Job.Status.DONE


def test_watcher_rereads_the_switch_only_after_its_interval(
    django_assert_num_queries: object,
) -> None:
    watcher = pausing.PauseWatcher(["default", "emails"], interval=3600)
    assert watcher.active() == ["default", "emails"]
    pausing.pause("emails")
    assert watcher.active() == ["default", "emails"]  # cached: bounded by the interval
    watcher.refresh()
    assert watcher.active() == ["default"]
    assert watcher.paused == ["emails"]
