"""Async views for the ASGI tests of aenqueue() and named_lock (tests/test_async.py)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from django_dbqueue import aenqueue, enqueue
from django_dbqueue.locks import named_lock
from tests.support import jobs


async def enqueue_async(request: HttpRequest) -> JsonResponse:
    job = await aenqueue(jobs.add, args=[int(request.GET["a"]), 2], queue="emails")
    return JsonResponse({"id": job.pk})


async def enqueue_sync(request: HttpRequest) -> JsonResponse:
    job = enqueue(jobs.add, args=[1, 2])  # the mistake the error message is for
    return JsonResponse({"id": job.pk})


@named_lock("async-view:{item}", blocking=False, on_fail=423)
async def locked(request: HttpRequest, item: str) -> HttpResponse:
    return HttpResponse(f"locked {item}")


urlpatterns = [
    path("enqueue-async/", enqueue_async),
    path("enqueue-sync/", enqueue_sync),
    path("locked/<str:item>/", locked),
]
