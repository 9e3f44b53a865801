"""Idle workers are woken by notifications, sent on commit only."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import transaction
from django.test import override_settings

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.queue import announce
from django_dbqueue.worker import wakeup
from django_dbqueue.worker.loop import Worker
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


def test_enqueue_many_wakes_the_queues_of_its_due_jobs_on_commit() -> None:
    with settings_with():
        listener = wakeup.listen(["emails"])
        assert listener is not None
        try:
            enqueue_many([{"task": jobs.noop}] * 3)
            assert not listener.wait(0.3), "another queue's jobs do not wake us"
            enqueue_many([{"task": jobs.noop, "queue": "emails", "run_after": 3600}] * 3)
            assert not listener.wait(0.3), "jobs for later wake nobody now"
            with transaction.atomic():
                enqueue_many([{"task": jobs.noop}, {"task": jobs.noop, "queue": "emails"}])
                assert not listener.wait(0.3), "nothing is sent before COMMIT"
            assert listener.wait(2.0)
            later = {"task": jobs.noop, "queue": "emails", "run_after": 3600}
            enqueue_many([later, {"task": jobs.noop, "queue": "emails", "run_after": 0}])
            assert listener.wait(2.0), "one due job among jobs for later wakes us"
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
                announce.notify(["default"])
            assert not listener.wait(0.3), "another project's job does not wake us"
            announce.notify(["default"])
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


def test_the_wake_up_kept_per_database_follows_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """enqueue() asks for the wake-up once per job database and settings; in poll mode it
    announces nothing (no payload, no channel), and a settings change is seen at once."""
    announced: list[object] = []
    monkeypatch.setattr(announce, "notify", lambda queues, **kw: announced.append(queues))
    expected = "postgres" if CURRENT_VENDOR == "postgresql" else "redis"
    with settings_with():
        assert announce.method() == expected
        with settings_with(WAKEUP=False):
            assert announce.method() == "poll"
            enqueue(jobs.noop)
        assert announced == [], "poll mode announces nothing"
        assert announce.method() == expected, "the change back is seen too"
        if CURRENT_VENDOR != "postgresql":  # (PostgreSQL's INSERT notifies by itself)
            enqueue(jobs.noop)
            assert announced == [{"default"}]
            with settings_with(WAKEUP_REDIS_ALIAS=None):
                assert announce.method() == "poll"
                enqueue(jobs.noop)
            assert announced == [{"default"}], "no channel: nothing announced"


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


# -- coalescing: a process announces the same queues at most once per COALESCE --------


@contextmanager
def subscriber() -> Iterator[Callable[[], list[str]]]:
    """A plain subscriber to the job channel, where workers hear it (Redis, or LISTEN on
    PostgreSQL). The callable returns the payloads received since its last call, read
    until 0.5 s pass without one."""
    if CURRENT_VENDOR == "postgresql":
        import psycopg
        from django.db import connection

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(f"LISTEN {announce.CHANNEL}")
            yield lambda: [n.payload for n in conn.notifies(timeout=0.5)]
        return
    pubsub = announce.redis_client("redis").pubsub()
    try:
        pubsub.subscribe(announce.redis_channel(announce.CHANNEL))
        confirmation = pubsub.get_message(timeout=5.0)
        assert confirmation is not None and confirmation["type"] == "subscribe"

        def received() -> list[str]:
            payloads = []
            while (message := pubsub.get_message(timeout=0.5)) is not None:
                payloads.append(message["data"].decode())
            return payloads

        yield received
    finally:
        pubsub.close()


def test_a_tight_loop_announces_far_fewer_jobs_than_it_enqueues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A window many enqueues long even on a loaded machine under coverage (5 ms an
    # enqueue was seen on PostgreSQL: with the 10 ms window, half of them announced).
    monkeypatch.setattr(announce, "COALESCE", 0.05)
    count = 300
    with settings_with(), subscriber() as received:
        time.sleep(3 * announce.COALESCE)  # nothing of an earlier test counts
        started = time.monotonic()
        for _ in range(count):
            enqueue(jobs.noop)
        elapsed = time.monotonic() - started
        heard = received()
        # Redis: at most one PUBLISH per COALESCE. PostgreSQL: one pg_notify per half
        # window from the INSERTs, and one more per window from commits that came late.
        assert 1 <= len(heard) <= 2 * elapsed / announce.COALESCE + 2, (len(heard), elapsed)
        assert len(heard) < count / 2, (len(heard), elapsed)
        assert set(heard) == {"default"}
        time.sleep(3 * announce.COALESCE)
        enqueue(jobs.noop)
        assert received() == ["default"], "a job after a pause is announced"
        enqueue(jobs.noop, queue="emails")
        assert received() == ["emails"], "other queues are announced of their own"


def test_an_announcement_counts_once_committed_and_a_late_commit_announces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(announce, "COALESCE", 1.0)  # a window wide enough to watch
    with settings_with(), subscriber() as received:
        time.sleep(1.1)
        enqueue(jobs.noop)
        enqueue(jobs.noop)
        assert received() == ["default"], "the second job is covered by the first one's"
        time.sleep(1.1)
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue(jobs.noop)
            raise RuntimeError("rolled back: its announcement (pg_notify) is dropped")
        enqueue(jobs.noop)
        assert received() == ["default"], "a rolled-back announcement covers nothing"
        with transaction.atomic():
            enqueue(jobs.noop)  # within the window of the last one: not announced...
            time.sleep(1.1)
        assert received() == ["default"], "...but it committed after the window: it is"


@pytest.mark.processes
@pytest.mark.parametrize("threads", ["1", "2"])
def test_jobs_enqueued_close_together_are_all_picked_up_without_polling(
    processes: Processes, worker_env: Callable[..., dict[str, str]], threads: str
) -> None:
    """Bursts, and pairs 2 to 8 ms apart: the announcements are coalesced, and no job
    waits for the (60 s) poll."""
    env = worker_env(**WAKE, POLL_INTERVAL=60, MIN_POLL_INTERVAL=60)
    proc = processes.run_jobs("--threads", threads, env=env)
    wait_until(lambda: WorkerRow.objects.exists(), timeout=30)
    time.sleep(1.0)  # the worker is idle, in a 60 s poll sleep unless woken

    def all_done(batch: list[Job]) -> bool:
        ids = [job.pk for job in batch]
        return Job.objects.filter(pk__in=ids, status=Job.Status.DONE).count() == len(ids)

    try:
        with settings_with():  # the producer publishes where the workers listen
            for round_ in range(4):
                burst = [enqueue(jobs.noop) for _ in range(25)]
                wait_until(lambda b=burst: all_done(b), timeout=5, interval=0.01)
                time.sleep(0.05 + round_ * 0.1)
            for round_ in range(20):
                first = enqueue(jobs.noop)
                time.sleep(0.002 * (1 + round_ % 4))
                second = enqueue(jobs.noop)
                wait_until(lambda b=[first, second]: all_done(b), timeout=5, interval=0.005)
                time.sleep(0.02 + (round_ % 5) * 0.03)
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
        print(output)  # the worker's log, shown when the test fails
        print(list(Job.objects.exclude(status=Job.Status.DONE).values("id", "status", "owner")))
    assert proc.returncode == 0


def test_a_worker_that_heard_an_announcement_claims_again_a_window_later() -> None:
    """The worker's half of coalescing: an empty claim that began less than COALESCE
    after an announcement was heard is followed by one more at that time; after a claim
    that began later, the worker waits to be woken."""
    with settings_with(POLL_INTERVAL=10):
        worker = Worker(queues=["default"], handle_signals=False)
        worker.listening.listen()
        listener = worker.listening.listener
        assert listener is not None
        try:
            time.sleep(2 * wakeup.COALESCE)
            enqueue(jobs.noop)
            worker.listening.idle(10)  # woken by the announcement
            heard = listener.heard_at
            worker.listening.claim_began = time.monotonic()  # a claim in the window came back empty
            worker.listening.idle(10)  # back at heard + COALESCE, not in 10 s
            assert heard + wakeup.COALESCE <= time.monotonic() < heard + 5
            # A claim that began in the window but returned after it: one more, at once.
            worker.listening.claim_began = heard
            time.sleep(2 * wakeup.COALESCE)
            began = time.monotonic()
            worker.listening.idle(10)
            assert time.monotonic() - began < 5
            worker.listening.claim_began = time.monotonic()  # the claim after the window
            threading.Timer(0.5, worker.stop).start()
            worker.listening.idle(10)  # only a wake-up (or the stop) ends this wait
            assert time.monotonic() >= heard + 0.5
        finally:
            worker.listening.close()


def test_a_redis_read_without_waiting_takes_every_message_in() -> None:
    """redis-py hands out one message a call, from what it has read off the socket: a
    read that does not wait (the relay's, before it waits on the socket again) goes on
    until none is left, or a message of ours behind another queue's would sit there
    unread, with the socket quiet. (tests/worker/test_relay.py has PostgreSQL's.)"""

    class ReadAlready:
        def __init__(self, *payloads: str) -> None:
            self.messages = [{"type": "message", "channel": "c", "data": p} for p in payloads]

        def get_message(self, timeout: float = 0.0) -> dict[str, str] | None:
            return self.messages.pop(0) if self.messages else None

    listener = wakeup.RedisListener.__new__(wakeup.RedisListener)
    wakeup._Heard.__init__(listener, ["default"])
    listener.names = {"c": announce.CHANNEL}
    listener.pubsub = ReadAlready("other", "emails", "default")
    assert listener.wait(0)
    listener.pubsub = ReadAlready("other")
    assert not listener.wait(0)
