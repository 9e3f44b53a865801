"""QUEUED -> CLAIMED: find the next runnable jobs and take them for one worker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_dbqueue.conf import settings
from django_dbqueue.queue import clock, ratelimits
from django_dbqueue.queue.candidates import (
    candidate_ids,
    queue_head,
    queue_heads,
    run_after_param,
)
from django_dbqueue.queue.claim_statement import claim_order, claim_unkeyed, worth_trying
from django_dbqueue.queue.concurrency import admit, release_parked
from django_dbqueue.queue.dialects import (
    dialect,
    plain_transaction,
    write_transaction,
)
from django_dbqueue.queue.reader import fetch_rows, job_from_row, row_reader
from django_dbqueue.queue.shares import Owner, owner_assignment
from django_dbqueue.status import CLAIMED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job

CLAIM_ORDER = ("-priority", "run_after", "id")
# Candidates read per claim, in batches: the first batch no other claimer holds is taken.
SPREAD = 4


class Claimed(list["Job"]):
    """The jobs one claim took, best first.

    Empty and ``contended``: runnable jobs were there, but other claimers took every one
    of them first. That is a busy queue, not an empty one: ask again at once.
    """

    def __init__(self, jobs: Sequence[Job] = (), contended: bool = False) -> None:
        super().__init__(jobs)
        self.contended = contended


def claim(
    model: type[Job], using: str, owner: Owner, batch_size: int, queues: Sequence[str]
) -> Claimed:
    """Claim up to ``batch_size`` runnable jobs of ``queues`` for ``owner`` (or, given
    :class:`~.shares.Shares`, for the workers that asked together, each its share).

    1. read candidate ids: a plain read that walks the claim index in order,
    2. in one short transaction, lock those ids skipping rows another claimer holds
       (re-checking the status), 3. one UPDATE by primary key, 4. COMMIT.
    Without locking reads (SQLite) all of it runs in one IMMEDIATE transaction instead.
    A claim of up to :data:`MOST_QUEUES_WALKED` queues (PostgreSQL; MariaDB/MySQL 2 ms or
    more away: :func:`walks_index`) does 1 and 2 in one locking read along each queue's
    claim index (:func:`_claim_along_index`); on PostgreSQL 1 to 4 are one statement for
    jobs without a concurrency key (:mod:`.claim_statement`).
    Attempts are counted here, so a job that kills its worker still uses one up.

    Two claimers reading at once read the same ids, and the slower one's locking read
    skips them all. So step 1 reads :data:`SPREAD` times the batch, and a claimer whose
    first batch of them is held locks the next one in the same transaction, and so on
    (with one claimer per host, a host's claim meets the claims of the other hosts: one
    batch each). If every one is taken, it reads again past the ids it found taken;
    taken three times over, it returns an empty :class:`Claimed` marked ``contended``.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    conn = connections[using]
    queue_list = list(queues)
    locking = dialect(conn).locking_reads
    # Concurrency keys: parked jobs whose key has a free slot become runnable. Looked
    # for now and then before a claim, and always before a claim comes back empty.
    release_parked(model, using, locking)
    limits = ratelimits.limited(queue_list)  # DBQUEUE["RATE_LIMITS"]: docs/workflows.md
    if limits:

        def claim_some(some: list[str], size: int) -> list[Job]:
            return _claim(model, using, owner, size, some, locking)

        return Claimed(ratelimits.claim_limited(using, queue_list, limits, batch_size, claim_some))
    jobs = _claim(model, using, owner, batch_size, queue_list, locking)
    if not jobs and release_parked(model, using, locking, force=True):
        jobs = _claim(model, using, owner, batch_size, queue_list, locking)
    return jobs


# A claim of this many queues or fewer walks each one's claim index (where the dialect
# walks it): each queue's read may lock a whole batch, of which the claim keeps a share,
# and on MariaDB/MySQL each is a round trip. More are read as candidates first.
MOST_QUEUES_WALKED = 4


def walks_index(using: str, queues: list[str]) -> bool:
    """Is a claim of ``queues`` a locking read along each queue's claim index
    (:func:`_claim_along_index`)? Up to :data:`MOST_QUEUES_WALKED` queues, on a database
    with locking reads that can walk it, and a server at least the dialect's
    ``along_index_from_round_trip`` away (MariaDB/MySQL: 2 ms, measured by the clock's
    readings; PostgreSQL: always)."""
    speaks = dialect(connections[using])
    if not (speaks.locking_reads and speaks.locks_along_claim_index):
        return False
    if not 1 <= len(queues) <= MOST_QUEUES_WALKED:
        return False
    least = speaks.along_index_from_round_trip
    return least <= 0 or clock.round_trip(using) >= least


def _claim(
    model: type[Job],
    using: str,
    owner: Owner,
    batch_size: int,
    queue_list: list[str],
    locking: bool,
) -> Claimed:
    conn = connections[using]
    if not locking:
        for _ in range(3):
            now = clock.now(using)
            with write_transaction(using):
                candidates = candidate_ids(model, conn, queue_list, now, batch_size, [])
                locked = _lock_ids(model, using, candidates, now, False)
                jobs = _mark(model, using, locked, owner, now, lock=False)
            # Candidates but no job: all were parked over their key's limit; read on.
            if jobs or not candidates:
                return Claimed(jobs)
        return Claimed(contended=True)
    if walks_index(using, queue_list):
        return _claim_along_index(model, using, owner, batch_size, queue_list)
    taken: list[int] = []
    for _ in range(3):
        now = clock.now(using)
        # SPREAD batches: the next is what to lock when other claimers, which read the
        # same candidates a moment before, hold or have taken the ones before it. A
        # small claim (a worker's first, one job a lane) spaces its tries a whole batch
        # apart, as the others' claims are: with SPREAD jobs in its window it lost to
        # every claim of a hundred, and a child of a host woken with the others took no
        # job at all while they drained 6,000.
        window = SPREAD * max(batch_size, int(settings.BATCH_SIZE))
        candidates = candidate_ids(model, conn, queue_list, now, window, taken)
        if not candidates:
            # Nothing runnable but what other claimers are taking: nothing for us.
            return Claimed()
        step = max(batch_size, len(candidates) // SPREAD)
        chunks = [candidates[i : i + batch_size] for i in range(0, len(candidates), step)]
        _, jobs = _take(model, using, owner, now, partial(_lock_first, model, using, chunks))
        if jobs:
            return Claimed(jobs)
        taken += candidates
    return Claimed(contended=True)


def _lock_first(
    model: type[Job], using: str, chunks: list[list[int]], now: datetime, lock: bool
) -> list[Job]:
    """:func:`_lock_ids` of the first of ``chunks`` of which any job is left to us, in
    one transaction. Claimers draining one queue read the same candidates whenever one
    reads while another's claim is under way (on MariaDB, 40 to 70 of every 100 claims
    of a 2-worker drain; a third of the claims of 3 hosts with one claim stream each):
    the later one then locked nothing, and read the index and began a transaction again."""
    for chunk in chunks:
        locked = _lock_ids(model, using, chunk, now, lock)
        if locked:
            return locked
    return []


def _claim_along_index(
    model: type[Job], using: str, owner: Owner, batch_size: int, queues: list[str]
) -> Claimed:
    """Where :func:`walks_index`: the locking read walks each queue's claim index and
    skips the rows other claimers hold, so two claimers never lock-read the same rows and
    neither has to read again. Empty: nothing runnable is left that another claimer does
    not hold. It reads again only when every job it locked was parked for its key.
    Where the dialect claims in one statement, that comes first; the keyed jobs it left
    are claimed here (queue/claim_statement.py). Several queues: a read of each, in one
    transaction, and the best ``batch_size`` of what they locked are claimed
    (:func:`_lock_heads`)."""
    one_statement = dialect(connections[using]).claims_in_one_statement
    for _ in range(3):
        now = clock.now(using)
        got: list[Job] = []
        if one_statement and worth_trying(using, queues):
            got, locked = claim_unkeyed(model, using, owner, batch_size, queues, now)
            if locked == len(got):
                return Claimed(got)
        read = partial(_lock_heads, model, using, queues, batch_size - len(got))
        locked, jobs = _take(model, using, owner, now, read)
        if got or jobs or not locked:
            return Claimed(sorted(got + jobs, key=claim_order))
    return Claimed(contended=True)


def _lock_heads(
    model: type[Job], using: str, queues: list[str], limit: int, now: datetime, lock: bool
) -> list[Job]:
    """The best ``limit`` of :func:`_lock_next` of each queue: one statement on
    PostgreSQL (``LATERAL``, :func:`~.candidates.queue_heads`). A locking read cannot go
    through a UNION ALL, so elsewhere each queue is read apart. Each queue's read may lock
    ``limit``: the rows beyond the best ``limit`` stay locked, unclaimed, until the
    COMMIT a moment later. (Only where :func:`walks_index`: always a locking read.)"""
    if len(queues) == 1:
        return _lock_next(model, using, queues[0], limit, now, lock)
    conn = connections[using]
    if dialect(conn).lateral_arrays:
        reader = row_reader(model, conn)
        sql = queue_heads(conn, reader.columns, conn.ops.quote_name(model._meta.db_table))
        params = [queues, QUEUED, run_after_param(model, conn, now), limit, limit]
        rows = fetch_rows(conn, sql, params)
        return [job_from_row(model, using, row, reader, conn) for row in rows]
    heads = [job for queue in queues for job in _lock_next(model, using, queue, limit, now, lock)]
    return sorted(heads, key=claim_order)[:limit]


def _take(
    model: type[Job],
    using: str,
    owner: Owner,
    now: datetime,
    read: Callable[[datetime, bool], list[Job]],
) -> tuple[int, list[Job]]:
    """In one short transaction, lock the rows ``read(now, lock=True)`` returns and claim
    them: (how many rows were locked, the jobs claimed)."""
    try:
        with plain_transaction(using):
            locked = read(now, True)
            return len(locked), _mark(model, using, locked, owner, now, lock=True)
    except _KeyedRows:
        # Concurrency keys may create rows through the ORM: Django's own transaction.
        with write_transaction(using):
            locked = read(now, True)
            return len(locked), _mark(model, using, locked, owner, now, lock=True)


class _KeyedRows(Exception):
    """Keyed jobs were locked inside a transaction Django does not know of: start over."""


def _lock_ids(
    model: type[Job], using: str, candidates: list[int], now: datetime, lock: bool
) -> list[Job]:
    """The candidates still runnable, locked (skipping rows other claimers hold), best first."""
    if not candidates:
        return []
    conn = connections[using]
    qn = conn.ops.quote_name
    speaks = dialect(conn)
    id_sql, id_params = speaks.ids_in(conn, qn("id"), candidates)
    queued = speaks.by_id_only(f"{qn('status')} = %s")
    # run_after again: another claim may have parked a candidate since it was read
    # (concurrency keys); claimed here it would keep run_after in year 9000 and, given
    # back or recovered after a crash, wait there with no key flagged to release it.
    where = f"{id_sql} AND {queued} AND {qn('run_after')} <= %s"
    jobs = _read_jobs(
        model, using, where, [*id_params, QUEUED, run_after_param(model, conn, now)], lock
    )
    rank = {job_id: index for index, job_id in enumerate(candidates)}
    jobs.sort(key=lambda job: rank[job.id])
    return jobs


def _lock_next(
    model: type[Job], using: str, queue: str, limit: int, now: datetime, lock: bool
) -> list[Job]:
    """The first ``limit`` runnable jobs of ``queue`` that no other claimer holds, locked,
    best first: a locking read along the claim index, which matches it column for column
    (InnoDB locks what a locking read scans)."""
    conn = connections[using]
    params = [QUEUED, queue, run_after_param(model, conn, now), limit]
    return _read_jobs(model, using, queue_head(conn), params, lock)


def _read_jobs(
    model: type[Job], using: str, where: str, params: list[Any], lock: bool
) -> list[Job]:
    """Jobs built from the rows of ``WHERE {where}``, in the order read."""
    conn = connections[using]
    reader = row_reader(model, conn)
    table = conn.ops.quote_name(model._meta.db_table)
    sql = f"SELECT {reader.columns} FROM {table} WHERE {where}"  # noqa: S608
    if lock:
        sql += " FOR UPDATE SKIP LOCKED"
    rows = fetch_rows(conn, sql, params)
    return [job_from_row(model, using, row, reader, conn) for row in rows]


def _mark(
    model: type[Job], using: str, jobs: list[Job], owner: Owner, now: datetime, lock: bool
) -> list[Job]:
    """Claim the locked ``jobs`` for ``owner`` (each for its owner, given shares): park
    those over their concurrency key's limit, then one UPDATE by primary key. Returns the
    jobs claimed."""
    if not jobs:
        return []
    conn = connections[using]
    qn = conn.ops.quote_name
    if any(job.concurrency_key is not None for job in jobs):
        if not conn.in_atomic_block:
            raise _KeyedRows
        jobs = admit(model, using, jobs, lock)  # concurrency keys: park what does not fit
    if not jobs:
        return []
    ids = [job.id for job in jobs]
    owners = [owner] * len(jobs) if isinstance(owner, str) else owner.take(len(jobs))
    owner_sql, owner_params = owner_assignment(conn, ids, owners)
    id_sql, id_params = dialect(conn).ids_in(conn, qn("id"), ids)
    sql = (
        f"UPDATE {qn(model._meta.db_table)} SET {qn('status')} = %s, "  # noqa: S608
        f"{qn('owner')} = {owner_sql}, {qn('owner_date')} = %s, "
        f"{qn('attempts')} = {qn('attempts')} + 1 "
        f"WHERE {id_sql}"
    )
    owner_date = conn.ops.adapt_datetimefield_value(now)
    with conn.cursor() as cursor:
        cursor.execute(sql, [CLAIMED, *owner_params, owner_date, *id_params])
    for job, name in zip(jobs, owners, strict=True):
        job.status, job.owner, job.owner_date = CLAIMED, name, now
        job.attempts += 1
    return jobs
