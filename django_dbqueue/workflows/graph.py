"""enqueue_many() with dependencies between the jobs it inserts (docs/workflows.md).

An item's ``depends_on`` may name other items of the same call by their index,
``item(3)``, next to jobs or ids that exist already. The whole call is checked first:
every item's task, arguments and options, every index in range and not the item itself,
and no cycle among the items (refused with InvalidJob naming the cycle, nothing written).
Then, in one transaction, the items are inserted in dependency order, each as
``enqueue(..., depends_on=...)`` inserts a job (its dependencies locked, its edges
written): an item's dependencies inside the call exist, with their ids, when it is
inserted. Items are inserted one statement at a time (not in multi-row INSERTs): a call
with dependencies costs what as many ``enqueue()`` calls cost, in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import router, transaction

from django_dbqueue import bounds
from django_dbqueue.enqueueing import build_job, save_job
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.options import NAMES
from django_dbqueue.workflows.dependencies import DEPENDS, Wanted


@dataclass(frozen=True)
class ItemRef:
    """A reference to the item of index ``index`` of the same enqueue_many() call."""

    index: int


def item(index: int) -> ItemRef:
    """``depends_on=[item(0)]`` in an enqueue_many() item: the job of item 0 of the call."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise InvalidJob(f"item() takes an item's index (an int), not {index!r}.")
    return ItemRef(index)


class _Item(NamedTuple):
    task: Any
    args: Any
    kwargs: Any
    options: dict[str, Any]
    outside: list[Any]  # jobs or ids that exist
    inside: list[int]  # indexes of items of the call
    rule: str


def enqueue_graph(items: Sequence[Any], refuse: Callable[[dict[str, Any]], None]) -> list[Job]:
    """Insert ``items`` (enqueue_many() items, some with ``depends_on``), each after the
    items it depends on, in one transaction; the jobs in the items' order.
    ``refuse(options)`` raises for options enqueue_many() does not take."""
    parsed = [_checked(index, one, refuse, len(items)) for index, one in enumerate(items)]
    order = _order(parsed)
    built = []
    for index, one in enumerate(parsed):
        try:
            built.append(build_job(one.task, one.args, one.kwargs, **one.options))
        except InvalidJob as exc:
            raise InvalidJob(f"job {index}: {exc}") from None
    saved: list[Job | None] = [None] * len(items)
    with transaction.atomic(using=router.db_for_write(Job)):
        for index in order:
            one, job = parsed[index], built[index]
            ids = bounds.check_depends_on([*one.outside, *(saved[i] for i in one.inside)])
            if ids:
                job.__dict__[DEPENDS] = Wanted(ids, one.rule)
            try:
                saved[index] = save_job(job)[0]
            except InvalidJob as exc:
                raise InvalidJob(f"job {index}: {exc}") from None
    return [job for job in saved if job is not None]


def _parts(one: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(task, args, kwargs, options) of a JobSpec or a dict item."""
    if not isinstance(one, Mapping) and hasattr(one, "options"):  # a JobSpec
        return one.task, one.args, one.kwargs, dict(one.options)
    if not isinstance(one, Mapping):
        one = dict(one)
    options = {k: v for k, v in one.items() if k not in ("task", "args", "kwargs")}
    return one.get("task"), one.get("args"), one.get("kwargs"), options


def _checked(index: int, one: Any, refuse: Callable[[dict[str, Any]], None], size: int) -> _Item:
    task, args, kwargs, options = _parts(one)
    try:
        if task is None:
            raise InvalidJob("every job needs a 'task'.")
        bounds.unknown_options("enqueue_many()", options, NAMES)
        refuse(options)
        depends_on = options.pop("depends_on", None)
        rule = options.pop("on_dependency_failure", None)
        rule = "cancel" if rule is None else bounds.check_on_dependency_failure(rule)
        outside, inside = _split(depends_on, index, size)
    except InvalidJob as exc:
        raise InvalidJob(f"job {index}: {exc}") from None
    return _Item(task, args, kwargs, options, outside, inside, rule)


def _split(depends_on: Any, index: int, size: int) -> tuple[list[Any], list[int]]:
    """(jobs or ids that exist, indexes of the call's items) of one item's depends_on."""
    if depends_on is None:
        return [], []
    if isinstance(depends_on, str | bytes) or not isinstance(depends_on, list | tuple):
        raise InvalidJob("depends_on must be a list of jobs, job ids or item(index).")
    outside = [dep for dep in depends_on if not isinstance(dep, ItemRef)]
    inside = sorted({dep.index for dep in depends_on if isinstance(dep, ItemRef)})
    for ref in inside:
        if not 0 <= ref < size:
            raise InvalidJob(f"depends_on: item({ref}) is out of range (items 0 to {size - 1}).")
        if ref == index:
            raise InvalidJob(f"depends_on: item({ref}) is the job itself.")
    bounds.check_depends_on(outside)
    return outside, inside


def _order(parsed: Sequence[_Item]) -> list[int]:
    """The items' indexes, each after those it depends on; InvalidJob on a cycle."""
    order: list[int] = []
    state = [0] * len(parsed)  # 0 new, 1 on the path, 2 placed
    for start in range(len(parsed)):
        if state[start]:
            continue
        path, stack = [start], [iter(parsed[start].inside)]
        state[start] = 1
        while stack:
            following = next(stack[-1], None)
            if following is None:
                stack.pop()
                done = path.pop()
                state[done] = 2
                order.append(done)
            elif state[following] == 1:
                cycle = [*path[path.index(following) :], following]
                raise InvalidJob(
                    "depends_on: the items form a cycle: " + " -> ".join(map(str, cycle)) + "."
                )
            elif state[following] == 0:
                state[following] = 1
                path.append(following)
                stack.append(iter(parsed[following].inside))
    return order
