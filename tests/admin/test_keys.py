"""The admin's requeue, cancel, run-now and delete on keyed jobs (queued, parked, running):
afterwards the key's slots are held by exactly the jobs that should hold them, and the
right jobs are runnable."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import ConcurrencyKey, Job
from django_dbqueue.queue.concurrency import PARKED_UNTIL, release_parked
from django_dbqueue.queue.finish import cancel_claimed
from tests.admin.test_jobs import CHANGELIST, login, messages_of, post_action, staff
from tests.support import jobs

pytestmark = pytest.mark.django_db

S = Job.Status
KEY = "customer:42"


def keyed(limit: int = 1) -> Job:
    return enqueue(jobs.noop, concurrency_key=KEY, concurrency_limit=limit, max_attempts=5)


def claim() -> list[int]:
    """What the workers take next (after they looked for parked jobs to release)."""
    release_parked(Job, "default", lock=False, force=True)
    return sorted(j.pk for j in Job.objects.claim("w1", 50))


def holding() -> list[int]:
    return sorted(
        Job.objects.filter(concurrency_key=KEY, status=S.CLAIMED).values_list("pk", flat=True)
    )


def parked() -> list[int]:
    waiting = Job.objects.filter(concurrency_key=KEY, status=S.QUEUED, run_after=PARKED_UNTIL)
    return sorted(waiting.values_list("pk", flat=True))


def operate(client: Client, job: Job, operation: str) -> list[str]:
    url = reverse("admin:django_dbqueue_job_operate", args=[job.pk])
    return messages_of(client.post(url, {"operation": operation}, follow=True))


def full_key() -> tuple[Job, Job, Job]:
    """One job holding the key's only slot, two parked behind it."""
    running, first, second = keyed(), keyed(), keyed()
    assert claim() == [running.pk]
    assert parked() == [first.pk, second.pk]
    return running, first, second


def test_cancelling_parked_jobs_frees_nothing_and_leaves_no_flag(operator: Client) -> None:
    running, first, second = full_key()
    post_action(operator, "cancel_jobs", [first, second])
    assert parked() == [] and holding() == [running.pk]
    assert claim() == []
    assert not ConcurrencyKey.objects.get(key=KEY).parked, "the release cleared the flag"


def test_cancelling_the_running_job_frees_its_slot_when_its_worker_stops(
    operator: Client,
) -> None:
    running, first, second = full_key()
    assert "asked to stop" in operate(operator, running, "cancel")[0]
    assert holding() == [running.pk], "still running: the slot stays taken"
    assert claim() == []
    running.refresh_from_db()
    assert cancel_claimed(Job, "default", "w1", running, "cancelled by an operator")
    assert claim() == [first.pk], "one slot freed, one parked job takes it"
    assert holding() == [first.pk] and parked() == [second.pk]


def test_requeueing_a_job_cancelled_while_parked_makes_it_runnable(operator: Client) -> None:
    running, first, second = full_key()
    operate(operator, first, "cancel")
    Job.objects.filter(pk=running.pk).update(status=S.DONE, finished_at=timezone.now())
    assert claim() == [second.pk]
    Job.objects.filter(pk=second.pk).update(status=S.DONE, finished_at=timezone.now())
    assert not ConcurrencyKey.objects.get(key=KEY).parked

    assert operate(operator, first, "requeue") == [f"Job #{first.pk} requeued."]
    first.refresh_from_db()
    assert first.run_after <= timezone.now(), "out of year 9000: nothing would release it"
    assert claim() == [first.pk]


def test_bulk_requeue_into_a_full_key_waits_for_the_slot(operator: Client) -> None:
    done = [keyed(), keyed()]
    Job.objects.filter(pk__in=[j.pk for j in done]).update(status=S.DONE)
    running = keyed()
    assert claim() == [running.pk]

    response = post_action(operator, "requeue_jobs", done)
    assert messages_of(response) == ["Requeued 2 job(s)."]
    assert claim() == [], "the key is full: the requeued jobs park"
    assert parked() == sorted(j.pk for j in done)
    assert Job.objects.filter(pk__in=[j.pk for j in done], attempts=0).count() == 2

    Job.objects.filter(pk=running.pk).update(status=S.DONE)
    assert claim() == [done[0].pk], "one slot, one of them"


def test_run_now_on_a_parked_job_does_not_jump_the_limit(operator: Client) -> None:
    running, first, second = full_key()
    response = post_action(operator, "run_jobs_now", [second])
    assert "1 job(s) will run" in messages_of(response)[0]
    assert claim() == [], "runnable, but the claim parks it again"
    assert holding() == [running.pk] and parked() == [first.pk, second.pk]


def test_delete_takes_parked_jobs_and_keeps_the_running_one(operator: Client) -> None:
    running, first, second = full_key()
    response = post_action(operator, "delete_jobs", [running, first], post="yes")
    assert messages_of(response)[0] == "Deleted 1 job(s)."
    assert holding() == [running.pk], "a running job is not deleted: its slot stays taken"
    assert parked() == [second.pk]
    Job.objects.filter(pk=running.pk).update(status=S.DONE)
    assert claim() == [second.pk]


def test_delete_of_a_finished_job_frees_nothing_and_takes_nothing(operator: Client) -> None:
    running, first, _ = full_key()
    Job.objects.filter(pk=first.pk).update(status=S.CANCELLED)
    post_action(operator, "delete_jobs", [first], post="yes")
    assert holding() == [running.pk] and claim() == []


def test_a_limit_of_three_takes_back_exactly_the_freed_slots(operator: Client) -> None:
    jobs_ = [keyed(3) for _ in range(6)]
    taken = claim()
    assert len(taken) == 3
    runs = [j for j in jobs_ if j.pk in taken]
    for job in runs[:2]:
        job.refresh_from_db()
        cancel_claimed(Job, "default", "w1", job, "stopped")
    post_action(operator, "requeue_jobs", runs[:2])
    again = claim()
    assert len(again) == 2 and len(holding()) == 3, "two slots freed, two taken"
    assert len(parked()) == 3


# -- the per-key page ------------------------------------------------------------------

KEYS_LIST = "admin:django_dbqueue_concurrencykey_changelist"


def test_key_page_shows_limit_holders_and_waiters_escaped(operator: Client) -> None:
    running, first, second = full_key()
    evil = "<script>alert('k')</script>"
    enqueue(jobs.noop, concurrency_key=evil, concurrency_limit=3)
    page = operator.get(reverse(KEYS_LIST)).content.decode()

    row = re.search(r"customer:42</a></t[hd]>(.*?)</tr>", page, re.S)
    assert row, page
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells == ["1", "1", "2", "2"], "limit, holding a slot, waiting, of them parked"
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#x27;k&#x27;)&lt;/script&gt;" in page
    assert "?concurrency_key=customer%3A42" in page, "links to the key's jobs"

    jobs_page = operator.get(reverse(CHANGELIST) + "?concurrency_key=customer%3A42")
    listed = {job.pk for job in jobs_page.context["cl"].result_list}
    assert listed == {running.pk, first.pk, second.pk}


def test_key_page_needs_job_view_permission_and_edits_nothing(operator: Client) -> None:
    full_key()
    nobody = login(staff("nobody"))
    assert nobody.get(reverse(KEYS_LIST)).status_code == 403
    viewer = login(staff("viewer", "view_job"))
    assert viewer.get(reverse(KEYS_LIST)).status_code == 200
    key = ConcurrencyKey.objects.get(key=KEY)
    change = reverse("admin:django_dbqueue_concurrencykey_change", args=[key.pk])
    assert operator.post(change, {"key": "other"}).status_code == 403
    delete = reverse("admin:django_dbqueue_concurrencykey_delete", args=[key.pk])
    assert operator.post(delete, {"post": "yes"}).status_code == 403
    assert ConcurrencyKey.objects.get(pk=key.pk).key == KEY
