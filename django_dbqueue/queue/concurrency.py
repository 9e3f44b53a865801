"""Concurrency keys: at most ``concurrency_limit`` claimed jobs per ``concurrency_key``.

There is no counter to keep right: the jobs holding a key's slots are its CLAIMED rows.
A claim that picked keyed jobs locks its keys' :class:`ConcurrencyKey` rows (claims of one
key queue there), counts their CLAIMED rows and marks only as many as fit, in a fixed
number of statements however many keys (:func:`admit`). Whatever
takes a job out of CLAIMED (done, failed, retried, cancelled, given back, recovered after
a crash, requeued, deleted) frees its slot by that very write.

A job that does not fit is *parked*: it stays QUEUED, keeps its attempts, and its
``run_after`` becomes :data:`PARKED_UNTIL`, which takes it out of the claim index's
range (no claim reads it again and again). The key's row is flagged ``parked``. The
worker's write that frees a slot makes as many parked jobs of its keys runnable as they
have free slots (:func:`release_freed`); claims look for flagged keys now and then as
the safety net (:func:`release_parked`). See docs/concurrency.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Exists, OuterRef

from django_dbqueue.queue import clock, ratelimits
from django_dbqueue.queue.dialects import dialect, key_position, write_transaction
from django_dbqueue.status import CLAIMED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import ConcurrencyKey, Job

logger = logging.getLogger("django_dbqueue.keys")


def _key_rows() -> type[ConcurrencyKey]:
    # From the app registry: models.py stands on the queue room (its manager is
    # queue/manager.py), so the queue's modules do not import it.
    return apps.get_model("django_dbqueue", "ConcurrencyKey")


# Far beyond any run_after enqueue() accepts, inside every database's datetime range.
PARKED_UNTIL = datetime(9000, 1, 1, tzinfo=UTC)
# Keys made runnable again per release_parked() call, and how often a process looks.
RELEASE_KEYS_PER_CALL = 50
RELEASE_INTERVAL = 0.2
# The largest concurrency_limit enqueue() accepts.
MAX_LIMIT = 1000

_last_release: dict[str, float] = {}
_release_cursor: dict[str, str] = {}  # per database: the last key a full call looked at


def lock_keys(conn: BaseDatabaseWrapper, keys: Sequence[str], lock: bool) -> dict[str, bool]:
    """Lock the rows of ``keys`` in key order, in one statement; their ``parked`` flags.

    Serializes with every other claim and release of these keys until the transaction
    ends. The rows are locked in ``ORDER BY key`` order, so two callers never wait on
    each other in a cycle: PostgreSQL locks rows as the sort returns them (its LockRows
    step runs above the Sort); InnoDB locks the index records it reads, so MariaDB is
    made to read the unique index of ``key`` in order (``FORCE INDEX``: for an IN list
    covering much of a small table it chose a full scan and a filesort, which would lock
    by id and wait on rows it does not even want). The flags are keyed by the row's
    stored key (on MariaDB ``"Key"`` finds the row of ``"key"``). Rows that are missing
    (retention deleted them while a job of the key waited) are created and locked by a
    second statement; without locking reads (SQLite) this only reads.
    """
    flags = _select_keys(conn, keys, lock)
    if len(flags) < len(set(keys)):
        # Missing rows, or keys the database takes for one (a case variant on MariaDB).
        ensure_keys(conn.alias, [key for key in keys if key not in flags])
        flags = _select_keys(conn, keys, lock)
    return flags


def _select_keys(conn: BaseDatabaseWrapper, keys: Sequence[str], lock: bool) -> dict[str, bool]:
    qn = conn.ops.quote_name
    speaks = dialect(conn)
    where, params = speaks.keys_in(conn, qn("key"), sorted(set(keys)))
    force = speaks.key_order_hint(conn, "key")
    sql = (
        f"SELECT {qn('key')}, {qn('parked')} FROM {qn('dbqueue_concurrency')}{force} "  # noqa: S608
        f"WHERE {where} ORDER BY {qn('key')}"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql + (" FOR UPDATE" if lock else ""), params)
        return {str(key): bool(parked) for key, parked in cursor.fetchall()}


def ensure_keys(using: str, keys: Sequence[str]) -> None:
    """Create the ConcurrencyKey rows of ``keys`` that do not exist yet."""
    rows = _key_rows()
    rows.objects.using(using).bulk_create(
        [rows(key=key) for key in sorted(set(keys))], ignore_conflicts=True
    )


def claimed_counts(conn: BaseDatabaseWrapper, model: type[Job], keys: Sequence[str]) -> list[int]:
    """How many jobs of each of ``keys`` are CLAIMED, in the order of ``keys``; one statement.

    A plain read after the keys' locks: READ COMMITTED (Django's default on every
    database) shows every claim of these keys that committed before we got the locks.
    The database picks the index: ``dbq_job_concurrency`` (the keys' rows, then each
    row's status), or on PostgreSQL for many keys the CLAIMED range of ``dbq_job_claim``.
    """
    if not keys:
        return []
    qn = conn.ops.quote_name
    rows, label, params = dialect(conn).keyed_rows(conn, qn(model._meta.db_table), keys)
    sql = (
        f"SELECT {label}, COUNT(*) FROM {rows} "  # noqa: S608
        f"AND j.{qn('status')} = %s GROUP BY {label}"
    )
    counts = [0] * len(keys)
    position = key_position(keys)
    with conn.cursor() as cursor:
        cursor.execute(sql, [*params, CLAIMED])
        for found, count in cursor.fetchall():
            counts[position[found]] = int(count)
    return counts


def admit(model: type[Job], using: str, jobs: list[Job], lock: bool) -> list[Job]:
    """The jobs of ``jobs`` (locked, about to be claimed) that fit their key's limit.

    The others are parked. Runs inside the claim's transaction: one statement locks
    every key's row (in key order, so two claims never wait on each other in a cycle),
    one counts the claimed jobs of every key, one parks what does not fit and one flags
    its keys, however many keys the batch has.
    """
    keyed: dict[str, list[Job]] = {}
    for job in jobs:
        if job.concurrency_key is not None:
            keyed.setdefault(job.concurrency_key, []).append(job)
    if not keyed:
        return jobs
    conn = connections[using]
    keys = sorted(keyed)
    lock_keys(conn, keys, lock)
    parked: list[Job] = []
    rated = ratelimits.for_keys(keys)  # RATE_LIMITS["key:NAME"]: a start slot per job
    for key, running in zip(keys, claimed_counts(conn, model, keys), strict=True):
        fits = []
        for job in keyed[key]:
            if running < (job.concurrency_limit or 1):
                running += 1
                fits.append(job)
            else:
                parked.append(job)
        if key in rated and fits:
            name = ratelimits.KEY_PREFIX + key
            wanted = min(len(fits), ratelimits.PER_CLAIM)
            parked += fits[len(ratelimits.take_here(using, name, rated[key], wanted)) :]
    if parked:
        _park(conn, model, parked)
    gone = {job.id for job in parked}
    return [job for job in jobs if job.id not in gone]


def _park(conn: BaseDatabaseWrapper, model: type[Job], jobs: list[Job]) -> None:
    qn = conn.ops.quote_name
    speaks = dialect(conn)
    until = model._meta.get_field("run_after").get_db_prep_value(PARKED_UNTIL, conn)
    id_sql, id_params = speaks.ids_in(conn, qn("id"), [job.id for job in jobs])
    key_sql, key_params = speaks.keys_in(
        conn, qn("key"), sorted({str(job.concurrency_key) for job in jobs})
    )
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(model._meta.db_table)} SET {qn('run_after')} = %s "  # noqa: S608
            f"WHERE {id_sql}",
            [until, *id_params],
        )
        cursor.execute(
            f"UPDATE {qn('dbqueue_concurrency')} SET {qn('parked')} = %s "  # noqa: S608
            f"WHERE {key_sql}",
            [True, *key_params],
        )


def release_parked(model: type[Job], using: str, lock: bool, force: bool = False) -> int:
    """Make parked jobs runnable where their key has free slots; returns how many.

    The safety net: a finished keyed job releases its key's parked jobs itself
    (:func:`release_freed`), but a job recorded by a supervisor after a crash, by lease
    recovery or by an operator's action is not looked at there. Called before claims, at
    most every RELEASE_INTERVAL seconds per process and database: one indexed read of
    the flagged keys when none is flagged, else one short transaction for up to
    RELEASE_KEYS_PER_CALL keys.
    """
    now_mono = time.monotonic()
    if not force and now_mono - _last_release.get(using, -RELEASE_INTERVAL) < RELEASE_INTERVAL:
        return 0
    _last_release[using] = now_mono
    # Round the flagged keys: a call starts after the last key the previous one looked
    # at, so with more flagged keys than RELEASE_KEYS_PER_CALL none waits on the others.
    flagged = _key_rows().objects.using(using).filter(parked=True).order_by("key")
    after = _release_cursor.get(using, "")
    keys = list(flagged.filter(key__gt=after).values_list("key", flat=True)[:RELEASE_KEYS_PER_CALL])
    if len(keys) < RELEASE_KEYS_PER_CALL and after:
        more = flagged.filter(key__lte=after).values_list("key", flat=True)
        keys += list(more[: RELEASE_KEYS_PER_CALL - len(keys)])
    _release_cursor[using] = keys[-1] if len(keys) == RELEASE_KEYS_PER_CALL else ""
    if not keys:
        return 0
    with write_transaction(using):
        return len(_release_keys(model, using, keys, lock))


def release_freed(model: type[Job], using: str, keys: Iterable[str | None]) -> set[str]:
    """After jobs of ``keys`` left CLAIMED (committed): release their keys' parked jobs.

    Returns the queues of the jobs made runnable. Called by every write of
    :mod:`.finish` that frees slots of keyed jobs; costs nothing for jobs without a key
    and one statement when none of the keys is flagged. That statement is a locking read
    (in autocommit: the locks go with the statement) so that it waits for a claim that
    holds a key's lock and may be parking a job because it still counted ours, and then
    reads the flag that claim wrote. On SQLite every write is serialized, and ours
    committed: a claim that counted our job committed before it, a later one sees it.
    A failure here is logged and left to :func:`release_parked`: the finish is recorded.
    """
    wanted = sorted({key for key in keys if key is not None})
    if not wanted:
        return set()
    conn = connections[using]
    lock = dialect(conn).locking_reads
    try:
        flagged = [key for key, parked in _select_keys(conn, wanted, lock).items() if parked]
        if not flagged:
            return set()
        with write_transaction(using):
            return set(_release_keys(model, using, flagged, lock))
    except DatabaseError as exc:
        if conn.in_atomic_block:
            raise
        logger.warning(
            "Could not release parked jobs of keys %s (%s); left to the next claim", wanted, exc
        )
        return set()


def _release_keys(model: type[Job], using: str, keys: list[str], lock: bool) -> list[str]:
    """Under the keys' locks, set run_after = now on as many parked jobs of each key
    (highest priority, then oldest) as it has free slots; clear the flag of each key
    none is left parked of. Returns the queue of each job released. At most five
    statements, however many keys."""
    conn = connections[using]
    qn = conn.ops.quote_name
    speaks = dialect(conn)
    table = qn(model._meta.db_table)
    flags = lock_keys(conn, keys, lock)
    keys = sorted(key for key, parked in flags.items() if parked)
    if not keys:
        return []
    running = claimed_counts(conn, model, keys)
    until = model._meta.get_field("run_after").get_db_prep_value(PARKED_UNTIL, conn)
    by_key = _parked(conn, model, keys, until)
    rated = ratelimits.for_keys(keys)
    released: list[tuple[Any, ...]] = []
    cleared: list[str] = []
    for index, key in enumerate(keys):
        # Release order: priority descending, then id (the window's row numbers).
        parked = sorted(by_key.get(index, []), key=lambda row: row[4])
        free = max(0, int(parked[0][3]) - running[index]) if parked else 0
        if key in rated and free:  # no more than may start now: their claims take slots
            free = min(free, ratelimits.free_count(using, ratelimits.KEY_PREFIX + key, rated[key]))
        released += parked[:free]
        if len(parked) <= free:
            cleared.append(key)
    with conn.cursor() as cursor:
        if released:
            now = model._meta.get_field("run_after").get_db_prep_value(clock.now(using), conn)
            id_sql, id_params = speaks.ids_in(conn, qn("id"), [row[1] for row in released])
            cursor.execute(
                f"UPDATE {table} SET {qn('run_after')} = %s "  # noqa: S608
                f"WHERE {id_sql} AND {qn('status')} = %s AND {qn('run_after')} = %s",
                [now, *id_params, QUEUED, until],
            )
        if cleared:
            key_sql, key_params = speaks.keys_in(conn, qn("key"), cleared)
            cursor.execute(
                f"UPDATE {qn('dbqueue_concurrency')} SET {qn('parked')} = %s "  # noqa: S608
                f"WHERE {key_sql}",
                [False, *key_params],
            )
    return [str(row[2]) for row in released]


def _parked(
    conn: BaseDatabaseWrapper, model: type[Job], keys: list[str], until: Any
) -> dict[int, list[tuple[Any, ...]]]:
    """Per key (its index in ``keys``), the parked jobs in release order and the first
    one's limit, up to one more than its limit: enough to release as many as fit and to
    tell whether any is left: rows of (key, id, queue, limit, row number).

    A plain read, never SKIP LOCKED: a claim whose candidate read came before the park
    locks the row for a moment to re-check it (MariaDB releases that lock once the WHERE
    fails); skipping it here cleared the flag with the row still parked, and it waited
    forever. Jobs are parked only under the key lock the caller holds, so this read sees
    every one of them. No lock is waited for while holding the keys': the UPDATE after
    it touches parked rows only, which no claim holds (it re-checks run_after and lets
    go of them).
    """
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    rows, label, params = dialect(conn).keyed_rows(conn, table, keys, by_key="dbq_job_concurrency")
    window = f"OVER (PARTITION BY {label} ORDER BY j.{qn('priority')} DESC, j.{qn('id')})"
    sql = (
        f"SELECT label, id, queue, lim, rn FROM (SELECT {label} AS label, "  # noqa: S608
        f"j.{qn('id')} AS id, j.{qn('queue')} AS queue, ROW_NUMBER() {window} AS rn, "
        f"FIRST_VALUE(COALESCE(j.{qn('concurrency_limit')}, 1)) {window} AS lim "
        f"FROM {rows} AND j.{qn('status')} = %s AND j.{qn('run_after')} = %s) AS p "
        f"WHERE rn <= lim + 1"
    )
    position = key_position(keys)
    by_key: dict[int, list[tuple[Any, ...]]] = {}
    with conn.cursor() as cursor:
        cursor.execute(sql, [*params, QUEUED, until])
        for row in cursor.fetchall():
            by_key.setdefault(position[row[0]], []).append(row)
    return by_key


def prune_keys(using: str, batch_size: int, max_seconds: float | None = None) -> int:
    """Delete the rows of keys no queued or claimed job uses; returns how many.

    Part of retention (once per RETENTION_INTERVAL across the cluster), after the old
    jobs are gone: deleting a key row when its last job finishes would add a write to
    every finish of a keyed job, for rows that cost nothing while they wait. Each row is
    deleted by primary key with the check in the same statement, never flagged rows.
    A job enqueued meanwhile finds its key's row gone: the claim makes it again
    (:func:`_lock_key`), so a row deleted a moment too early costs one INSERT.
    """
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    keys = _key_rows().objects.using(using)
    job_model = apps.get_model("django_dbqueue", "Job")
    active = job_model.objects.using(using).filter(
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
