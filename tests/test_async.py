"""aenqueue() and aenqueue_many() from plain asyncio and from async views served through
ASGI (Django's AsyncClient), and enqueue() called from async code (docs/async.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from django_dbqueue import aenqueue, aenqueue_many, enqueue, enqueue_many
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.locks import named_lock
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("async_connections"),
]


def test_aenqueue_from_plain_asyncio_takes_enqueues_options() -> None:
    async def main() -> Job:
        return await aenqueue(jobs.add, args=[1, 2], queue="emails", priority=3, timeout=9)

    job = asyncio.run(main())
    row = Job.objects.get(pk=job.pk)
    assert (row.task, row.args, row.queue, row.priority, row.timeout) == (
        "tests.support.jobs.add",
        [1, 2],
        "emails",
        3,
        9,
    )
    assert row.status == Job.Status.QUEUED


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: aenqueue(jobs.add, args=[{1, 2}]), InvalidJob, "JSON"),
        (lambda: aenqueue(jobs.add, queue="nope"), InvalidJob, "nope"),
        (lambda: aenqueue("os.system", args=["true"]), InvalidJob, "not a registered task"),
        (lambda: aenqueue(jobs.add, args=[1, 2], priorty=3), TypeError, "priorty"),
        (lambda: aenqueue_many([{"task": jobs.add, "args": [object()]}]), InvalidJob, "JSON"),
    ],
)
def test_aenqueue_refuses_what_enqueue_refuses_and_writes_nothing(
    call: Any, error: type[Exception], match: str
) -> None:
    async def main() -> Any:
        return await call()

    with pytest.raises(error, match=match):
        asyncio.run(main())
    assert not Job.objects.exists()


def test_aenqueue_many_inserts_every_job_in_order() -> None:
    async def main() -> list[Job]:
        specs = [{"task": jobs.add, "args": [i, i]} for i in range(5)]
        return await aenqueue_many([*specs, {"task": jobs.async_add, "args": [9, 9]}])

    created = asyncio.run(main())
    assert [job.args for job in created] == [[i, i] for i in range(5)] + [[9, 9]]
    assert Job.objects.filter(pk__in=[job.pk for job in created]).count() == 6


def test_enqueue_from_async_code_names_aenqueue_and_writes_nothing() -> None:
    async def one() -> None:
        enqueue(jobs.add, args=[1, 2])

    async def many() -> None:
        enqueue_many([{"task": jobs.add, "args": [1, 2]}])

    with pytest.raises(InvalidJob, match=r"use `await aenqueue\(\.\.\.\)`"):
        asyncio.run(one())
    with pytest.raises(InvalidJob, match=r"use `await aenqueue_many\(\.\.\.\)`"):
        asyncio.run(many())
    assert not Job.objects.exists()


def test_enqueue_wrapped_in_sync_to_async_still_works() -> None:
    async def main() -> Job:
        return await sync_to_async(enqueue)(jobs.add, args=[4, 5])

    assert Job.objects.get(pk=asyncio.run(main()).pk).args == [4, 5]


# -- async views through ASGI --------------------------------------------------------


@pytest.mark.urls("tests.support.async_views")
def test_an_async_view_enqueues_with_aenqueue() -> None:
    async def main() -> Any:
        return await AsyncClient().get("/enqueue-async/", {"a": "40"})

    response = asyncio.run(main())
    assert response.status_code == 200
    row = Job.objects.get(pk=response.json()["id"])
    assert (row.args, row.queue) == ([40, 2], "emails")


@pytest.mark.urls("tests.support.async_views")
def test_enqueue_in_an_async_view_raises_the_error_naming_aenqueue() -> None:
    async def main() -> Any:
        return await AsyncClient().get("/enqueue-sync/")

    with pytest.raises(InvalidJob, match="aenqueue"):
        asyncio.run(main())
    assert not Job.objects.exists()


@pytest.mark.urls("tests.support.async_views")
def test_named_lock_on_an_async_view_answers_423_while_the_lock_is_held() -> None:
    async def main() -> tuple[Any, Any, Any]:
        client = AsyncClient()
        free = await client.get("/locked/a/")
        async with named_lock("async-view:a"):
            busy = await client.get("/locked/a/")
            other = await client.get("/locked/b/")
        return free, busy, other

    free, busy, other = asyncio.run(main())
    assert (free.status_code, free.content) == (200, b"locked a")
    assert busy.status_code == 423 and busy["Retry-After"]
    assert (other.status_code, other.content) == (200, b"locked b")
