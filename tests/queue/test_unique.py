"""Unique jobs: one job per key while it waits or runs, across processes and requeues."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.queue.finish import finish_failed_attempt
from tests.support import ROOT, jobs, reap

S = Job.Status


def finish(job: Job, status: str = S.FAILED) -> None:
    """What finishing does to the key: the row leaves the active states, the key is freed."""
    Job.objects.filter(pk=job.pk).update(status=status, finished_at=timezone.now(), unique_key=None)


@pytest.mark.django_db
def test_a_requeued_job_gets_its_key_back() -> None:
    job = enqueue(jobs.noop, unique_key="report:1")
    finish(job)

    assert Job.objects.filter(pk=job.pk).requeue() == 1  # type: ignore[attr-defined]

    job.refresh_from_db()
    assert (job.status, job.unique_key) == (S.QUEUED, "report:1")
    assert enqueue(jobs.noop, unique_key="report:1").pk == job.pk, "the key dedupes again"


@pytest.mark.django_db
def test_a_job_that_failed_for_good_keeps_its_key_for_a_requeue() -> None:
    job = enqueue(jobs.noop, unique_key="report:2", max_attempts=1)
    Job.objects.filter(pk=job.pk).update(status=S.CLAIMED, owner="w1", attempts=1)
    job.refresh_from_db()
    assert finish_failed_attempt(Job, "default", "w1", job, "boom", "ValueError") == S.FAILED
    job.refresh_from_db()
    assert (job.status, job.unique_key) == (S.FAILED, None), "the key is free meanwhile"

    Job.objects.filter(pk=job.pk).requeue()  # type: ignore[attr-defined]

    job.refresh_from_db()
    assert (job.status, job.unique_key) == (S.QUEUED, "report:2")


@pytest.mark.django_db
def test_a_requeue_leaves_a_job_alone_when_another_job_holds_its_key() -> None:
    old = enqueue(jobs.noop, unique_key="report:3")
    finish(old)
    new = enqueue(jobs.noop, unique_key="report:3")
    assert new.pk != old.pk

    report = Job.objects.filter(pk=old.pk).requeue_report()  # type: ignore[attr-defined]

    assert report.requeued == 0
    assert report.key_held == [(old.pk, "report:3", new.pk)]
    assert f"#{old.pk} ('report:3', held by job #{new.pk})" in report.describe()
    old.refresh_from_db()
    assert (old.status, old.unique_key) == (S.FAILED, None)


@pytest.mark.django_db
def test_two_finished_jobs_of_one_key_requeued_together_give_one_job() -> None:
    first = enqueue(jobs.noop, unique_key="report:4")
    finish(first)
    second = enqueue(jobs.noop, unique_key="report:4")
    finish(second, S.DONE)
    plain = enqueue(jobs.noop)
    finish(plain)

    report = Job.objects.filter(pk__in=[first.pk, second.pk, plain.pk]).requeue_report()  # type: ignore[attr-defined]

    assert report.requeued == 2
    assert report.key_held == [(second.pk, "report:4", first.pk)]
    assert Job.objects.filter(unique_key="report:4").get().pk == first.pk


@pytest.mark.django_db
def test_the_admin_names_jobs_whose_key_is_held(admin_client: Client) -> None:
    old = enqueue(jobs.noop, unique_key="report:5")
    finish(old)
    new = enqueue(jobs.noop, unique_key="report:5")
    freed = enqueue(jobs.noop, unique_key="report:6")
    finish(freed)

    response = admin_client.post(
        reverse("admin:django_dbqueue_job_changelist"),
        {"action": "requeue_jobs", "_selected_action": [old.pk, freed.pk]},
        follow=True,
    )

    texts = [str(m) for m in response.context["messages"]]
    assert texts == [
        "Requeued 1 job(s).",
        "1 job(s) not requeued because another job holds their unique key: "
        f"#{old.pk} ('report:5', held by job #{new.pk}).",
    ]


@pytest.mark.django_db
def test_the_admin_job_page_says_why_a_job_was_not_requeued(admin_user: User) -> None:
    client = Client()
    client.force_login(admin_user)
    old = enqueue(jobs.noop, unique_key="report:7")
    finish(old)
    new = enqueue(jobs.noop, unique_key="report:7")

    response = client.post(
        reverse("admin:django_dbqueue_job_operate", args=[old.pk]),
        {"operation": "requeue"},
        follow=True,
    )

    texts = [str(m) for m in response.context["messages"]]
    assert texts == [
        "1 job(s) not requeued because another job holds their unique key: "
        f"#{old.pk} ('report:7', held by job #{new.pk})."
    ]


@pytest.mark.django_db
def test_enqueue_many_refuses_unique_keys_and_says_why() -> None:
    with pytest.raises(InvalidJob, match="one taken key would fail the whole batch"):
        enqueue_many([{"task": jobs.noop, "unique_key": "k"}])
    assert not Job.objects.exists()


def test_concurrent_enqueues_from_many_processes_make_one_job_per_key(
    worker_env: Callable[..., dict[str, str]],
) -> None:
    env = worker_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.unique_enqueuer", "200", "50"],
            cwd=ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=30)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        seen: dict[str, set[int]] = {}
        for proc in procs:
            assert proc.stdout is not None and proc.stderr is not None
            out = proc.stdout.read()
            assert proc.wait(timeout=600) == 0, proc.stderr.read()
            for key, ids in json.loads(out).items():
                seen.setdefault(key, set()).update(ids)
    finally:
        reap(procs)

    assert len(seen) == 50
    assert all(len(ids) == 1 for ids in seen.values()), "every process got the same job"
    assert Job.objects.count() == 50
    rows = dict(Job.objects.values_list("unique_key", "pk"))
    assert {key: {pk} for key, pk in rows.items()} == seen
