"""One claim for several workers: a host's claimer takes jobs for each of its children.

A supervisor of many children claims for all of them at once (worker/handout.py): each
child asks for as many jobs as its free lanes start soon, and one claim takes the sum.
Every job is still claimed under the name of the child that will run it, so a dead
child's jobs are its own (worker/deaths.py), its leases are renewed from its slot and its
finishes are guarded by its name, exactly as when it claimed itself. :class:`Shares` says
whose each job is: the claim's jobs, best first, go to the askers in the order they
asked, each up to what it asked for; the claiming UPDATE writes each job's owner
(:func:`owner_assignment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.dialects import ids_in


class Shares:
    """The askers of one claim and how many jobs each asked for, in the order they asked."""

    def __init__(self, wants: Sequence[tuple[str, int]]) -> None:
        self.wants = [(name, count) for name, count in wants if count > 0]
        if len({name for name, _ in self.wants}) != len(self.wants):
            raise ValueError("each worker asks once per claim")
        self.total = sum(count for _, count in self.wants)
        self._next = 0  # the asker whose share is being filled
        self._given = 0  # jobs given to it so far

    def upcoming(self, count: int) -> list[str]:
        """The owners :meth:`take` would give the next ``count`` jobs (fewer where fewer
        are asked for), without taking them: for a statement that numbers its rows."""
        saved = self._next, self._given
        left = sum(wanted for _, wanted in self.wants[self._next :]) - self._given
        try:
            return self.take(min(count, left))
        finally:
            self._next, self._given = saved

    def take(self, count: int) -> list[str]:
        """The owners of the claim's next ``count`` jobs (a claim may mark its jobs in
        several steps: each step takes the next owners)."""
        owners: list[str] = []
        while len(owners) < count and self._next < len(self.wants):
            name, wanted = self.wants[self._next]
            step = min(wanted - self._given, count - len(owners))
            owners += [name] * step
            self._given += step
            if self._given == wanted:
                self._next, self._given = self._next + 1, 0
        if len(owners) < count:
            raise ValueError(f"{count} jobs claimed for {self.total} asked for")
        return owners


def owner_assignment(
    conn: BaseDatabaseWrapper, ids: list[int], owners: list[str]
) -> tuple[str, list[Any]]:
    """The SET expression and its parameters that give job ``ids[i]`` the owner
    ``owners[i]``: the owner itself for one, a ``CASE`` by id for several."""
    names = list(dict.fromkeys(owners))
    if len(names) == 1:
        return "%s", [names[0]]
    column = conn.ops.quote_name("id")
    branches, params = [], []
    pairs = list(zip(ids, owners, strict=True))
    for name in names:
        sql, id_params = ids_in(conn, column, [job_id for job_id, o in pairs if o == name])
        branches.append(f"WHEN {sql} THEN %s")
        params += [*id_params, name]
    return f"CASE {' '.join(branches)} END", params


# Whose a claim's jobs are: one worker's, or those of several that asked together.
Owner = str | Shares
