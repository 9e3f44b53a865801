"""Concurrency keys: at most ``concurrency_limit`` claimed jobs per ``concurrency_key``.

There is no counter to keep right: the jobs holding a key's slots are its CLAIMED rows.
A claim that picked keyed jobs locks each key's :class:`ConcurrencyKey` row (claims of one
key queue there), counts the key's CLAIMED rows and marks only as many as fit. Whatever
takes a job out of CLAIMED (done, failed, retried, cancelled, given back, recovered after
a crash, requeued, deleted) frees its slot by that very write.

A job that does not fit is *parked*: it stays QUEUED, keeps its attempts, and its
``run_after`` becomes :data:`PARKED_UNTIL`, which takes it out of the claim index's
range (no claim reads it again and again). The key's row is flagged ``parked``; claims
look for flagged keys (:func:`release_parked`) and make as many parked jobs runnable as
the key has free slots. See docs/concurrency.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_dbqueue.queue.dialects import placeholders, write_transaction
from django_dbqueue.status import CLAIMED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# Far beyond any run_after enqueue() accepts, inside every database's datetime range.
PARKED_UNTIL = datetime(9000, 1, 1, tzinfo=UTC)
# Keys made runnable again per release_parked() call, and how often a process looks.
RELEASE_KEYS_PER_CALL = 50
RELEASE_INTERVAL = 0.2
# The largest concurrency_limit enqueue() accepts.
MAX_LIMIT = 1000

_last_release: dict[str, float] = {}
_release_cursor: dict[str, str] = {}  # per database: the last key a full call looked at


def _lock_key(conn: BaseDatabaseWrapper, key: str, lock: bool) -> None:
    """Serialize with every other claim of ``key`` until the transaction ends."""
    qn = conn.ops.quote_name
    table = qn("dbqueue_concurrency")
    with conn.cursor() as cursor:
        sql = f"SELECT {qn('id')} FROM {table} WHERE {qn('key')} = %s"  # noqa: S608
        cursor.execute(sql + (" FOR UPDATE" if lock else ""), [key])
        if cursor.fetchone() is None:
            # enqueue() creates the row; it is only missing if someone deleted it.
            ensure_keys(conn.alias, [key])
            cursor.execute(sql + (" FOR UPDATE" if lock else ""), [key])


def ensure_keys(using: str, keys: Sequence[str]) -> None:
    """Create the ConcurrencyKey rows of ``keys`` that do not exist yet."""
    from django_dbqueue.models import ConcurrencyKey

    ConcurrencyKey.objects.using(using).bulk_create(
        [ConcurrencyKey(key=key) for key in sorted(set(keys))], ignore_conflicts=True
    )


def _claimed(conn: BaseDatabaseWrapper, model: type[Job], key: str) -> int:
    # A plain read after the lock: READ COMMITTED (Django's default on every database)
    # shows every claim of this key that committed before we got the lock.
    qn = conn.ops.quote_name
    sql = (
        f"SELECT COUNT(*) FROM {qn(model._meta.db_table)} "  # noqa: S608
        f"WHERE {qn('concurrency_key')} = %s AND {qn('status')} = %s"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [key, CLAIMED])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def admit(model: type[Job], using: str, jobs: list[Job], lock: bool) -> list[Job]:
    """The jobs of ``jobs`` (locked, about to be claimed) that fit their key's limit.

    The others are parked. Runs inside the claim's transaction; keys are locked in
    sorted order so two claims never wait on each other in a cycle.
    """
    keyed: dict[str, list[Job]] = {}
    for job in jobs:
        if job.concurrency_key is not None:
            keyed.setdefault(job.concurrency_key, []).append(job)
    if not keyed:
        return jobs
    conn = connections[using]
    parked: list[Job] = []
    for key in sorted(keyed):
        _lock_key(conn, key, lock)
        running = _claimed(conn, model, key)
        for job in keyed[key]:
            if running < (job.concurrency_limit or 1):
                running += 1
            else:
                parked.append(job)
    if parked:
        _park(conn, model, parked)
    gone = {job.id for job in parked}
    return [job for job in jobs if job.id not in gone]


def _park(conn: BaseDatabaseWrapper, model: type[Job], jobs: list[Job]) -> None:
    qn = conn.ops.quote_name
    until = model._meta.get_field("run_after").get_db_prep_value(PARKED_UNTIL, conn)
    ids = [job.id for job in jobs]
    keys = sorted({str(job.concurrency_key) for job in jobs})
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(model._meta.db_table)} SET {qn('run_after')} = %s "  # noqa: S608
            f"WHERE {qn('id')} IN ({placeholders(len(ids))})",
            [until, *ids],
        )
        cursor.execute(
            f"UPDATE {qn('dbqueue_concurrency')} SET {qn('parked')} = %s "  # noqa: S608
            f"WHERE {qn('key')} IN ({placeholders(len(keys))})",
            [True, *keys],
        )


def release_parked(model: type[Job], using: str, lock: bool, force: bool = False) -> int:
    """Make parked jobs runnable where their key has free slots; returns how many.

    Called before claims, at most every RELEASE_INTERVAL seconds per process and
    database: one indexed read of the flagged keys when none is flagged.
    """
    now_mono = time.monotonic()
    if not force and now_mono - _last_release.get(using, -RELEASE_INTERVAL) < RELEASE_INTERVAL:
        return 0
    _last_release[using] = now_mono
    from django_dbqueue.models import ConcurrencyKey

    # Round the flagged keys: a call starts after the last key the previous one looked
    # at, so with more flagged keys than RELEASE_KEYS_PER_CALL none waits on the others.
    flagged = ConcurrencyKey.objects.using(using).filter(parked=True).order_by("key")
    after = _release_cursor.get(using, "")
    keys = list(flagged.filter(key__gt=after).values_list("key", flat=True)[:RELEASE_KEYS_PER_CALL])
    if len(keys) < RELEASE_KEYS_PER_CALL and after:
        more = flagged.filter(key__lte=after).values_list("key", flat=True)
        keys += list(more[: RELEASE_KEYS_PER_CALL - len(keys)])
    _release_cursor[using] = keys[-1] if len(keys) == RELEASE_KEYS_PER_CALL else ""
    released = 0
    for key in keys:
        with write_transaction(using):
            released += _release_key(model, using, key, lock)
    return released


def _release_key(model: type[Job], using: str, key: str, lock: bool) -> int:
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    _lock_key(conn, key, lock)
    running = _claimed(conn, model, key)
    until = model._meta.get_field("run_after").get_db_prep_value(PARKED_UNTIL, conn)
    sql = (
        f"SELECT {qn('id')}, {qn('concurrency_limit')} FROM {table} "  # noqa: S608
        f"WHERE {qn('concurrency_key')} = %s AND {qn('status')} = %s "
        f"AND {qn('run_after')} = %s ORDER BY {qn('priority')} DESC, {qn('id')} LIMIT %s"
    )
    # A plain read, never SKIP LOCKED: a claim whose candidate read came before the
    # park locks the row for a moment to re-check it (MariaDB releases that lock once
    # the WHERE fails); skipping it here cleared the flag with the row still parked,
    # and it waited forever. Jobs are parked only under the key lock we hold, so this
    # read sees every one of them. No lock is waited for while holding the key's: the
    # UPDATE below touches parked rows only, which no claim holds (it re-checks
    # run_after and lets go of them).
    with conn.cursor() as cursor:
        cursor.execute(sql, [key, QUEUED, until, MAX_LIMIT + 1])
        waiting: list[tuple[Any, ...]] = list(cursor.fetchall())
    free = max(0, (waiting[0][1] or 1) - running) if waiting else 0
    ids = [row[0] for row in waiting[:free]]
    if ids:
        now = model._meta.get_field("run_after").get_db_prep_value(timezone.now(), conn)
        with conn.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {qn('run_after')} = %s "  # noqa: S608
                f"WHERE {qn('id')} IN ({placeholders(len(ids))}) AND {qn('status')} = %s "
                f"AND {qn('run_after')} = %s",
                [now, *ids, QUEUED, until],
            )
    if len(waiting) <= free:
        with conn.cursor() as cursor:
            cursor.execute(
                f"UPDATE {qn('dbqueue_concurrency')} SET {qn('parked')} = %s "  # noqa: S608
                f"WHERE {qn('key')} = %s",
                [False, key],
            )
    return len(ids)


def prune_keys(using: str, batch_size: int, max_seconds: float | None = None) -> int:
    """Delete the rows of keys no queued or claimed job uses; returns how many.

    Part of retention (once per RETENTION_INTERVAL across the cluster), after the old
    jobs are gone: deleting a key row when its last job finishes would add a write to
    every finish of a keyed job, for rows that cost nothing while they wait. Each row is
    deleted by primary key with the check in the same statement, never flagged rows.
    A job enqueued meanwhile finds its key's row gone: the claim makes it again
    (:func:`_lock_key`), so a row deleted a moment too early costs one INSERT.
    """
    from django.db.models import Exists, OuterRef

    from django_dbqueue.models import ConcurrencyKey, Job

    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    keys = ConcurrencyKey.objects.using(using)
    active = Job.objects.using(using).filter(
        concurrency_key=OuterRef("key"), status__in=[QUEUED, CLAIMED]
    )
    deleted, last = 0, 0
    while deadline is None or time.monotonic() < deadline:
        ids = list(
            keys.filter(id__gt=last).order_by("id").values_list("id", flat=True)[:batch_size]
        )
        if not ids:
            break
        last = ids[-1]
        count, _ = keys.filter(id__in=ids, parked=False).filter(~Exists(active)).delete()
        deleted += count
    return deleted
