"""Cluster-wide rate limits, enforced at claim (docs/workflows.md).

A limit is per queue (``RATE_LIMITS = {"partner_api": ...}``) or per concurrency key
(``{"key:api.example.com": ...}``: the jobs of that ``concurrency_key``, whatever their
queue; :func:`~django_dbqueue.queue.concurrency.admit` takes a key's slots in the
claim's transaction and parks its jobs that got none, as it parks jobs over the key's
concurrency limit).

A limit of N starts per period is N :class:`~django_dbqueue.models.RateSlot` rows. A
claim of a limited queue first takes free slots (used more than ``period`` plus a
margin ago) with ``FOR UPDATE SKIP LOCKED`` in a short transaction of its own, stamps
them, claims at most that many jobs, and frees the slots it did not use. Every job
claimed holds a slot for a period, so no window of ``period`` sees more than N claims;
jobs over the limit are never claimed. No lock outlives the slot transaction, and two
claimers skip each other's slots rather than wait. Times are the database's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.apps import apps
from django.db.models.functions import Now

from django_dbqueue.conf import PerSettings, settings
from django_dbqueue.queue.dialects import write_transaction

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# A slot is free again this much after its period (at most MARGIN_MAX seconds): a job
# starts a moment after its claim, and a slot reused on the dot could let a slow start
# and a quick one fall into one window.
MARGIN = 0.2
MARGIN_MAX = 0.5
# Jobs of a limited queue one claim takes: one, so it starts as soon as it is claimed
# (a claimed batch runs one job after another: its last would start a while after the
# claim that counted it, and could share a window with a slot's next claim).
PER_CLAIM = 1
FREE = datetime(2000, 1, 1, tzinfo=UTC)  # a slot never used, or given back
# A RATE_LIMITS name of this prefix limits the jobs of a concurrency key, not a queue.
KEY_PREFIX = "key:"


class Limit(NamedTuple):
    limit: int
    period: float


def parse(value: Any) -> dict[str, Limit]:
    """``DBQUEUE["RATE_LIMITS"]`` checked: {key: Limit}. Raises ValueError naming the
    mistake (the system check reports it)."""
    if not isinstance(value, Mapping):
        raise ValueError("RATE_LIMITS must be a dict of {queue: {'limit': N, 'period': s}}.")
    limits = {}
    folded: dict[str, str] = {}
    for key, spec in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= 255:
            raise ValueError(f"RATE_LIMITS: {key!r} is not a queue name (1-255 characters).")
        if key.startswith(KEY_PREFIX) and not key[len(KEY_PREFIX) :]:
            raise ValueError(f"RATE_LIMITS: {key!r} names no concurrency key ('key:NAME').")
        # MariaDB/MySQL compare the slots' keys without case: two such names would share.
        if folded.setdefault(key.casefold(), key) != key:
            raise ValueError(
                f"RATE_LIMITS: {folded[key.casefold()]!r} and {key!r} differ only in case."
            )
        if not isinstance(spec, Mapping) or set(spec) != {"limit", "period"}:
            raise ValueError(f"RATE_LIMITS[{key!r}] must be {{'limit': N, 'period': seconds}}.")
        limit, period = spec["limit"], spec["period"]
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ValueError(f"RATE_LIMITS[{key!r}]['limit'] must be a whole number, 1-10000.")
        if (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or not (0.01 <= period <= 86_400)
        ):
            raise ValueError(f"RATE_LIMITS[{key!r}]['period'] must be 0.01 to 86400 seconds.")
        limits[key] = Limit(limit, float(period))
    return limits


def _read_limits() -> dict[str, Limit]:
    return parse(settings.RATE_LIMITS)


_limits = PerSettings(_read_limits)  # read once per settings, not once per claim


def limited(queues: Sequence[str]) -> dict[str, Limit]:
    """The rate limits of ``queues`` (empty when none is set)."""
    limits = _limits()
    if not limits:
        return {}
    return {queue: limits[queue] for queue in queues if queue in limits}


def for_keys(keys: Sequence[str]) -> dict[str, Limit]:
    """The rate limits of concurrency keys ``keys`` (``"key:NAME"``), by key."""
    limits = _limits()
    if not limits:
        return {}
    return {key: limits[KEY_PREFIX + key] for key in keys if KEY_PREFIX + key in limits}


def claim_limited(
    using: str,
    queues: Sequence[str],
    limits: Mapping[str, Limit],
    batch_size: int,
    claim_some: Callable[[list[str], int], list[Job]],
) -> list[Job]:
    """Claim from ``queues``: the unlimited ones as usual, each limited one at most as
    many jobs as it has free slots. ``claim_some(queues, n)`` is the plain claim."""
    free = [queue for queue in queues if queue not in limits]
    jobs = list(claim_some(free, batch_size)) if free else []
    for queue, limit in limits.items():
        room = min(batch_size - len(jobs), PER_CLAIM)
        if room <= 0:
            break
        slots = take(using, queue, limit, room)
        if not slots:
            continue
        got = claim_some([queue], len(slots))
        release(using, slots[len(got) :])
        jobs += got
    return jobs


_READY: set[tuple[str, str, int]] = set()


def _slots(using: str, key: str, limit: Limit) -> Any:
    model = apps.get_model("django_dbqueue", "RateSlot")
    if (using, key, limit.limit) not in _READY:  # once per process and limit
        rows = [model(key=key, slot=n, used_at=FREE) for n in range(limit.limit)]
        model.objects.using(using).bulk_create(rows, ignore_conflicts=True)
        _READY.add((using, key, limit.limit))
    return model.objects.using(using).filter(key=key, slot__lt=limit.limit)


def take(using: str, key: str, limit: Limit, wanted: int) -> list[int]:
    """Up to ``wanted`` free slots of ``key``, stamped now; their ids."""
    with write_transaction(using):
        return take_here(using, key, limit, wanted)


def take_here(using: str, key: str, limit: Limit, wanted: int) -> list[int]:
    """:func:`take` in the caller's transaction (a claim's: the slots stay locked until
    it ends, and are used if it commits)."""
    free = _free(using, key, limit)
    locked = free.select_for_update(skip_locked=True).order_by("slot")
    ids = list(locked.values_list("id", flat=True)[:wanted])
    if ids:
        _slots(using, key, limit).filter(id__in=ids).update(used_at=Now())
    return ids


def free_count(using: str, key: str, limit: Limit) -> int:
    """How many of ``key``'s slots are free now (a plain read)."""
    return int(_free(using, key, limit).count())


def _free(using: str, key: str, limit: Limit) -> Any:
    wait = limit.period + min(MARGIN * limit.period, MARGIN_MAX)
    return _slots(using, key, limit).filter(used_at__lt=Now() - timedelta(seconds=wait))


def release(using: str, ids: Sequence[int]) -> None:
    """Slots taken for jobs that were not there: free again."""
    if ids:
        model = apps.get_model("django_dbqueue", "RateSlot")
        model.objects.using(using).filter(id__in=list(ids)).update(used_at=FREE)
