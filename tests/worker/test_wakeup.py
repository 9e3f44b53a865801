"""Idle workers are woken by notifications, sent on commit only."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
from django.db import transaction
from django.test import override_settings

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.worker import wakeup
from tests.support import CURRENT_VENDOR, Processes, jobs, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
# PostgreSQL wakes through LISTEN/NOTIFY; the others through Redis when configured.
WAKE = {} if CURRENT_VENDOR == "postgresql" else {"WAKEUP_REDIS_ALIAS": "redis"}


def settings_with(**extra: object) -> override_settings:
    from django.conf import settings

    return override_settings(DBQUEUE={**settings.DBQUEUE, **WAKE, **extra})


def test_listener_hears_committed_jobs_of_its_queues_only() -> None:
    with settings_with():
        listener = wakeup.listen(["default"])
        assert listener is not None
        try:
            enqueue(jobs.noop)
            assert listener.wait(2.0)
            enqueue(jobs.noop, queue="emails")
            assert not listener.wait(0.3), "another queue's job does not wake us"
            with pytest.raises(RuntimeError), transaction.atomic():
                enqueue(jobs.noop)
                raise RuntimeError("rolled back")
            assert not listener.wait(0.3), "a rolled-back job wakes nobody"
            with transaction.atomic():
                enqueue(jobs.noop)
                assert not listener.wait(0.3), "nothing is sent before COMMIT"
            assert listener.wait(2.0)
            enqueue(jobs.noop, run_after=3600)
            assert not listener.wait(0.3), "a job for later wakes nobody now"
        finally:
            listener.close()


@pytest.mark.only_vendor("sqlite", "mysql")
def test_projects_sharing_redis_under_other_key_prefixes_do_not_wake_each_other() -> None:
    from django.conf import settings

    other = {**settings.CACHES["redis"], "KEY_PREFIX": "another-project"}
    with settings_with():
        listener = wakeup.listen(["default"])
        assert listener is not None
        try:
            with override_settings(CACHES={**settings.CACHES, "redis": other}):
                wakeup.notify(["default"])
            assert not listener.wait(0.3), "another project's job does not wake us"
            wakeup.notify(["default"])
            assert listener.wait(2.0)
        finally:
            listener.close()


def test_a_job_of_a_rolled_back_savepoint_wakes_nobody() -> None:
    with settings_with():
        listener = wakeup.listen(["default"])
        assert listener is not None
        try:
            with transaction.atomic():
                with pytest.raises(RuntimeError), transaction.atomic():
                    enqueue(jobs.noop)
                    raise RuntimeError("the inner block failed")
                enqueue(jobs.noop, queue="emails")
            assert not listener.wait(0.3), "the rolled-back savepoint's NOTIFY is dropped"
            with transaction.atomic():
                with pytest.raises(RuntimeError), transaction.atomic():
                    enqueue(jobs.noop, queue="emails")
                    raise RuntimeError("the inner block failed")
                enqueue(jobs.noop)
            assert listener.wait(2.0), "the committed job wakes us"
        finally:
            listener.close()


def test_without_a_wakeup_channel_workers_poll() -> None:
    with settings_with(WAKEUP=False):
        assert wakeup.method() == "poll"
        assert wakeup.listen(["default"]) is None


@pytest.mark.processes
def test_idle_worker_wakes_at_once_despite_a_long_poll_interval(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    env = worker_env(**WAKE, POLL_INTERVAL=30, MIN_POLL_INTERVAL=30)
    proc = processes.run_jobs(env=env)
    wait_until(lambda: WorkerRow.objects.exists(), timeout=30)
    time.sleep(1.0)  # the worker is idle, in a 30 s poll sleep unless woken
    delays = []
    for _ in range(5):
        with settings_with():  # the producer publishes where the workers listen
            job = enqueue(jobs.noop)
        sent = time.monotonic()
        wait_until(
            lambda j=job: Job.objects.get(pk=j.pk).status == Job.Status.DONE,
            timeout=10,
            interval=0.005,
        )
        delays.append(time.monotonic() - sent)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert max(delays) < 5, delays
