"""Working through a large selection of jobs a chunk of primary keys at a time.

On MySQL/MariaDB an UPDATE locks every index entry it scans: one statement over "all
failed jobs of this task" would hold locks on a big range of the table the workers
claim from. Chunks of ids keep every write short and by primary key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from django.db.models import QuerySet

from django_dbqueue.models import Job
from django_dbqueue.queue.actions import JobQuerySet

T = TypeVar("T")
CHUNK_SIZE = 500


def pk_chunks(queryset: QuerySet[Job], size: int | None = None) -> Iterator[list[int]]:
    """The primary keys of ``queryset``, newest first, ``size`` at a time.

    Keyset pagination (``id < last``): an action that moves rows out of the filter
    (requeueing the "failed" list) neither skips nor repeats rows.
    """
    size = size or CHUNK_SIZE
    ids = queryset.order_by("-pk").values_list("pk", flat=True)
    last: int | None = None
    while True:
        page = ids.filter(pk__lt=last) if last is not None else ids
        chunk = list(page[:size])
        if not chunk:
            return
        yield chunk
        last = chunk[-1]


def apply_in_chunks(
    queryset: QuerySet[Job], operation: Callable[[JobQuerySet], T]
) -> tuple[int, list[T]]:
    """Run ``operation`` on ``queryset`` by chunks of ids: (rows selected, results)."""
    selected, results = 0, []
    for chunk in pk_chunks(queryset):
        selected += len(chunk)
        results.append(operation(Job.objects.primary().filter(pk__in=chunk)))
    return selected, results
