"""One claim in flight per host: a supervisor's children take turns to claim.

Every claimer reads the same head of the claim index. Sixteen children claiming at once
read the same candidates, and all but one lock nothing (measured: 83% of the claim
transactions of 1 supervisor x 16 children locked nothing, 101 statements per 100 no-op
jobs). So the children of one supervisor claim in turn: a child holds the host's claim
turn, an exclusive ``flock`` on a file the supervisor made, for one claim (a candidate
read, one short transaction) and lets it go. The next child then reads past what the
last one took. Each child still claims for itself, under its own name, so a dead child's
jobs are its own and are settled as before (``worker/deaths.py``); the turn only orders
the claims. The kernel lets a lock go when its holder dies, so a child killed in the
middle of a claim never blocks the others.

Across hosts claims can still collide: a claim that finds every job it saw taken
(``Claimed.contended``) waits a jittered, growing pause (:func:`contended_pause`) before
it asks again, rather than asking again at once with the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import secrets
import tempfile
from collections.abc import Iterator

# A supervisor of this many children or more gives them a claim turn. Two children
# taking turns drained no-op jobs about a fifth slower on MariaDB (12 interleaved pairs
# on a quiet machine: 7,920 against 9,985 jobs/s): so few collide too seldom to pay for
# the wait. Sixteen sent 9 statements per 100 no-op jobs instead of 57 (docs/benchmarks.md).
TURNS_FROM = 4

# After a contended claim: a pause drawn from [half, all] of BASE * 2 ** (n - 1), at
# most MAX, for the n-th contended claim in a row.
CONTENDED_PAUSE = 0.005
CONTENDED_PAUSE_MAX = 0.05


def contended_pause(in_a_row: int) -> float:
    """Seconds to wait after the ``in_a_row``-th contended claim in a row: jittered, so
    claimers that collided do not collide again, and growing while they keep colliding."""
    ceiling = min(CONTENDED_PAUSE_MAX, CONTENDED_PAUSE * 2 ** max(0, in_a_row - 1))
    return random.uniform(ceiling / 2, ceiling)


class ClaimTurns:
    """The claim turn of one supervisor's children: made by the supervisor before it
    forks, taken by a child around each claim (:meth:`turn`).

    The lock is on a file with no name where ``/proc`` shows a process's open files
    (Linux): the supervisor makes a temporary file, keeps it open and deletes its name
    at once, and each child opens it again through ``/proc/<supervisor>/fd/<n>``. So a
    supervisor that is SIGKILLed leaves no file behind. Elsewhere it is a named file in
    the temporary directory, deleted when the supervisor stops.
    """

    def __init__(self, children: int) -> None:
        self.children = children  # the supervisor's (some claims take turns from more)
        self._owner = os.getpid()
        self._fd: int | None = None
        self._fd_pid = 0
        self._anchor: int | None = None
        name = f"dbqueue-claim-turn-{self._owner}-{secrets.token_hex(8)}"
        self.path = os.path.join(tempfile.gettempdir(), name)
        if os.path.isdir(f"/proc/{self._owner}/fd"):
            self._anchor, named = tempfile.mkstemp(prefix=f"{name}-")
            os.unlink(named)
            self.path = f"/proc/{self._owner}/fd/{self._anchor}"

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the host's claim turn (waiting for the child that has it) for a claim."""
        fd = self._open()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _open(self) -> int:
        # A lock belongs to an open file, which a fork shares: each process opens its own.
        if self._fd is None or self._fd_pid != os.getpid():
            if self._anchor is not None:
                # The kernel's own link to the supervisor's file: a new open file of it.
                self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            else:
                # A file deleted meanwhile (a /tmp cleaner) is made again: that costs
                # order, not a crash. Never through a symbolic link someone else put there.
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self.path, flags, 0o600)
            self._fd_pid = os.getpid()
        return self._fd

    def remove(self) -> None:
        """Close or delete the file (the supervisor, once its children are gone)."""
        if os.getpid() != self._owner:
            return
        if self._anchor is not None:
            with contextlib.suppress(OSError):
                os.close(self._anchor)
            self._anchor = None
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
