"""One claimer per host: the supervisor claims for its children and hands the jobs out.

Every claimer reads the same head of the claim index: sixteen children claiming for
themselves read the same candidates, and each claim takes only what one child's lanes
start soon. So a supervisor of :data:`HAND_OUT_FROM` children or more claims for all of
them (on MariaDB/MySQL and PostgreSQL: :func:`hands_out`), from a thread of its own
(:class:`HostClaims`), and the database sees one claim stream per host:

- a child that wants jobs sends how many (what its free lanes start within
  ``CLAIM_AHEAD``, as before) and its queues down its pipe, and waits for the answer
  (:class:`Handout`, the child's side);
- the claimer thread takes every request that came in meanwhile and makes one claim of
  their sum (at most :data:`MOST_AT_ONCE` batches; the rest are served next), in which
  every job is claimed under the name of the child that asked for it
  (:class:`~django_dbqueue.queue.shares.Shares`): a child's jobs are its own in the
  table, so its leases, finishes and death are handled exactly as when it claimed itself;
- each child gets its jobs, as the claim built them, down its pipe, holds them in its
  slot and runs them. A claim that found jobs, but fewer than were asked for (other
  hosts took some of those it saw), fills the requests in the order they came; a child
  left with none is not answered yet: its request is the first the next claim serves.
  An empty answer means the claim found nothing (the queue is empty, or every job it
  saw was taken: ``contended``, and the child pauses before it asks again). A claim
  that found the queues empty answers every request for them that was waiting when it
  began: at the end of a drain, one empty claim, not one for every four children.

A child that dies between the claim and the hand-out: the supervisor marks it gone
(:meth:`HostClaims.gone`) before it settles its jobs, and the claimer looks at that mark
after the claim's COMMIT. Either the mark came first, and the claimer gives the jobs back
itself, or the COMMIT did, and the settling finds them in the table by owner
(worker/deaths.py). A database error is passed to each child that asked, which waits it
out as it did when it claimed itself.

A supervisor's main loop never claims: it keeps the leases and settles deaths whatever
the database does to the claimer's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import Any

from django.db import connections, router

from django_dbqueue import signals
from django_dbqueue.models import Job
from django_dbqueue.queue.claim import Claimed
from django_dbqueue.queue.dialects import dialect
from django_dbqueue.queue.reader import job_from_fields
from django_dbqueue.queue.shares import Shares
from django_dbqueue.worker.connections import TRANSIENT_ERRORS, refresh_connections

logger = logging.getLogger("django_dbqueue.supervisor")

# A supervisor of this many children or more claims for them. Two children claiming for
# themselves collide seldom; taking turns cost them a fifth of a MariaDB drain
# (docs/benchmarks.md, 2026-11-26).
HAND_OUT_FROM = 4
# One claim takes at most this many batches (the workers' batch size each) for the
# children that asked; the requests beyond it are served by the next claim, at once.
MOST_AT_ONCE = 4

# After a contended claim: a pause drawn from [half, all] of BASE * 2 ** (n - 1), at
# most MAX, for the n-th contended claim in a row.
CONTENDED_PAUSE = 0.005
CONTENDED_PAUSE_MAX = 0.05


def hands_out(children: int) -> bool:
    """Does a supervisor of ``children`` claim for them? From :data:`HAND_OUT_FROM`, on
    a database with locking reads. SQLite's claims queue on its write lock, so they never
    collide; and a connection of SQLite's open in the supervisor when it forks a child
    corrupts the child's own locks on the file (its lock table is copied, the locks are
    not): the child's writes then wait for ever."""
    if children < HAND_OUT_FROM:
        return False
    return dialect(connections[router.db_for_write(Job)]).locking_reads


def contended_pause(in_a_row: int) -> float:
    """Seconds to wait after the ``in_a_row``-th contended claim in a row: jittered, so
    claimers that collided do not collide again, and growing while they keep colliding."""
    ceiling = min(CONTENDED_PAUSE_MAX, CONTENDED_PAUSE * 2 ** max(0, in_a_row - 1))
    return random.uniform(ceiling / 2, ceiling)


class Handout:
    """A child's side: :meth:`claim` asks the supervisor's claimer instead of the database."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def claim(self, name: str, limit: int, queues: Sequence[str]) -> Claimed:
        """Up to ``limit`` jobs of ``queues``, claimed for ``name`` (this child) by the
        host's claimer; raises the database error the claim met."""
        self._conn.send((limit, list(queues)))
        try:
            answer = self._conn.recv()
        except EOFError:
            raise RuntimeError("the supervisor's claimer is gone") from None
        if isinstance(answer, BaseException):
            raise answer
        using, keys, rows, contended = answer
        jobs = [job_from_fields(Job, using, zip(keys, row, strict=True)) for row in rows]
        signals.jobs_claimed.send(Job, jobs=jobs, worker=name)
        return Claimed(jobs, contended)

    def close(self) -> None:
        """Close this end (the supervisor's copy, once the child has its own)."""
        self._conn.close()


@dataclass(eq=False)
class _Link:
    """The supervisor's end of one child's pipe."""

    conn: Connection
    name: str
    gone: bool = False


@dataclass(eq=False)
class _Request:
    link: _Link
    limit: int
    queues: tuple[str, ...]


class HostClaims:
    """Made by the supervisor before it forks; :meth:`start` starts the claimer thread.
    For each child: :meth:`open` before the fork, :meth:`started` after it, :meth:`gone`
    once it has exited, before its jobs are settled."""

    def __init__(self, batch_size: int) -> None:
        self._most = MOST_AT_ONCE * batch_size
        self._links: dict[int, _Link] = {}  # the children's, by slot
        self._served: list[_Link] = []  # those the thread waits on; gone ones it closes
        self._lock = threading.Lock()
        self._pending: list[_Request] = []
        self._opening: dict[int, Connection] = {}
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._thread: threading.Thread | None = None

    def open(self, index: int) -> Handout:
        """A new pipe for child ``index``: the side to hand to the child."""
        ours, theirs = Pipe(duplex=True)
        self._opening[index] = ours
        return Handout(theirs)

    def started(self, index: int, name: str) -> None:
        """Child ``index`` runs as ``name``: serve it."""
        with self._lock:
            self._links[index] = _Link(self._opening.pop(index), name)
            self._served.append(self._links[index])
        self._wake()

    def gone(self, index: int) -> None:
        """Child ``index`` exited: hand it nothing more."""
        with self._lock:
            link = self._links.get(index)
            if link is not None:
                link.gone = True
        self._wake()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dbqueue-host-claims", daemon=True)
        self._thread.start()

    def keep_running(self) -> None:
        """Start the thread again if it died (it logged why): the children wait on it."""
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            self.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                return  # stuck on the database: its pipes must not be closed under it
        for conn in [*self._opening.values(), *(link.conn for link in self._served)]:
            conn.close()
        os.close(self._wake_read)
        os.close(self._wake_write)
        self._links.clear()
        self._served.clear()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"!")

    # -- the claimer thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Every request that came during the last claim goes into the next.
                self._listen(0.0 if self._pending else 1.0)
                self._pending = [request for request in self._pending if not request.link.gone]
                if self._pending:
                    self._serve(self._next_claim())
        except Exception:
            logger.exception("Supervisor: the host's claimer failed; starting it again")
        finally:
            connections.close_all()

    def _listen(self, timeout: float) -> None:
        """Wait for requests (``timeout`` seconds at most) and take every one that came."""
        with self._lock:
            for link in self._served:
                if link.gone:
                    link.conn.close()
            self._served = [link for link in self._served if not link.gone]
            links = {link.conn: link for link in self._served}
        for ready in wait([*links, self._wake_read], timeout):
            if ready == self._wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_read, 4096)
                continue
            link = links[ready]  # type: ignore[index]
            try:
                limit, queues = link.conn.recv()
            except (EOFError, OSError):
                link.gone = True  # it exited: the supervisor settles what it had
                continue
            self._pending.append(_Request(link, int(limit), tuple(queues)))

    def _next_claim(self) -> list[_Request]:
        """The requests the next claim serves: the first one's queues (children see a
        queue paused at slightly different times), in the order they came, up to
        :data:`MOST_AT_ONCE` batches."""
        room = self._most
        first = self._pending[0]
        served: list[_Request] = []
        rest: list[_Request] = []
        for request in self._pending:
            if request.queues == first.queues and (not served or request.limit <= room):
                served.append(request)
                room -= request.limit
            else:
                rest.append(request)
        self._pending = rest
        return served

    def _serve(self, requests: list[_Request]) -> None:
        shares = Shares([(request.link.name, request.limit) for request in requests])
        try:
            refresh_connections()
            claimed = Job.objects.claim(shares, shares.total, requests[0].queues)
        except Exception as exc:
            if isinstance(exc, TRANSIENT_ERRORS):
                refresh_connections()
            else:
                logger.exception("Supervisor: a claim for the host's workers failed")
            for request in requests:
                self._send(request.link, _sendable(exc))
            return
        if not claimed and not claimed.contended:
            # Nothing runnable: the answer of every request for these queues that came
            # before this claim began (those still pending), not a claim each.
            alike = [request for request in self._pending if request.queues == requests[0].queues]
            self._pending = [request for request in self._pending if request not in alike]
            requests = requests + alike
        self._hand_out(requests, claimed)

    def _hand_out(self, requests: list[_Request], claimed: Claimed) -> None:
        """Each child its jobs of ``claimed``. A claim that found jobs, but none for a
        child (others took part of what it saw), leaves that child's request first in line
        for the next claim: an empty answer would say the queue is empty (a --burst child
        exits)."""
        mine: dict[str, list[Job]] = defaultdict(list)
        for job in claimed:
            mine[str(job.owner)].append(job)
        using = router.db_for_write(Job)
        unserved = []
        for request in requests:
            jobs = mine.get(request.link.name, [])
            if claimed and not jobs:
                unserved.append(request)
                continue
            keys = [key for key in jobs[0].__dict__ if key != "_state"] if jobs else []
            rows = [tuple(job.__dict__[key] for key in keys) for job in jobs]
            if request.link.gone or not self._send(
                request.link, (using, keys, rows, claimed.contended)
            ):
                self._give_back(request.link.name, jobs)
        self._pending[:0] = unserved

    def _send(self, link: _Link, answer: Any) -> bool:
        """Send ``answer`` to a child; False when it is gone."""
        try:
            link.conn.send(answer)
        except OSError:
            link.gone = True
            return False
        return True

    def _give_back(self, name: str, jobs: list[Job]) -> None:
        """Jobs claimed for a child that exited before it could take them."""
        if not jobs:
            return
        try:
            Job.objects.give_back(name, [job.id for job in jobs])
        except TRANSIENT_ERRORS as exc:
            logger.warning(
                "Supervisor: could not give back %s job(s) claimed for %s, which exited "
                "(%s); they are recovered when their leases expire",
                len(jobs),
                name,
                exc,
                extra={"event": "jobs_given_back", "worker": name},
            )


def _sendable(exc: Exception) -> Exception:
    """``exc`` as it can cross the pipe: as it is where it pickles (the database's
    errors), else a RuntimeError that names it."""
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
