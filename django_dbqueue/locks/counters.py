"""A shared counter with wrap-around: the next id in [min_value, max_value], atomically.

On Redis it is one Lua script (INCR, wrapping to ``min_value`` past ``max_value``); on the
database one ``UPDATE ... SET value = CASE ... END`` on the ``dbqueue_counter`` row, read
back in the same transaction, never a read-then-write. Which row a counter uses:
:func:`~django_dbqueue.locks.counter_rows.counter_row`.
"""

from __future__ import annotations

from django.db import connections, router, transaction
from django.db.models import Case, F, Q, Value, When

from django_dbqueue.locks.counter_rows import counter_row
from django_dbqueue.locks.named import default_backend_name
from django_dbqueue.queue.conflicts import retry_quietly

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1


def next_counter_value(
    name: str,
    *,
    min_value: int = 1,
    max_value: int = BIGINT_MAX,
    backend: str | None = None,
    using: str | None = None,
) -> int:
    """Advance counter ``name`` and return its new value: ``min_value`` first, and again
    after ``max_value``. ``backend`` is "redis" or "database" (default: "redis" when
    the default lock backend is "redis", else "database"); ``using`` is the cache or database
    alias. Inside a caller's transaction the database counter row stays locked (and the
    value may roll back) until that transaction ends."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"A counter name must be a non-empty string, not {name!r}.")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (min_value, max_value)):
        raise ValueError("min_value and max_value must be integers.")
    if not BIGINT_MIN < min_value <= max_value <= BIGINT_MAX:
        raise ValueError(
            f"Need -2**63 < min_value <= max_value < 2**63, got [{min_value}, {max_value}]."
        )
    kind = backend or ("redis" if default_backend_name() == "redis" else "database")
    if kind == "redis":
        from django_dbqueue.locks.redis import redis_counter_next

        return redis_counter_next(name, min_value, max_value, using)
    if kind != "database":
        raise ValueError(f"Counter backend must be 'redis' or 'database', not {kind!r}.")
    return database_counter_next(counter_row(name), min_value, max_value, using)


def database_counter_next(row: str, min_value: int, max_value: int, using: str | None) -> int:
    from django_dbqueue.models import Counter

    alias = using or router.db_for_write(Counter)
    rows = Counter.objects.using(alias).filter(name=row)
    advance = Case(
        When(Q(value__gte=max_value) | Q(value__lt=min_value), then=Value(min_value)),
        default=F("value") + 1,
    )

    def advanced() -> int | None:
        with transaction.atomic(using=alias):
            if rows.update(value=advance):
                # Our UPDATE holds the row lock until commit: this reads our own value.
                return int(rows.values_list("value", flat=True).get())
        return None

    def create() -> object:
        return Counter.objects.using(alias).get_or_create(
            name=row, defaults={"value": min_value - 1}
        )

    outermost = not connections[alias].in_atomic_block
    for _ in range(2):
        # A Galera node refuses the commit (1213) when another node advanced the row
        # first: tried again when the transaction is ours alone, never a caller's.
        value = retry_quietly("counter", advanced) if outermost else advanced()
        if value is not None:
            return value
        # First use: create the row outside that transaction (no gap-lock deadlock between
        # two first users on InnoDB), one below min_value so the UPDATE yields min_value.
        # Two Galera nodes creating it at once: one commit is refused (1213), and tried
        # again it finds the other's row.
        retry_quietly("counter", create) if outermost else create()
    raise RuntimeError(f"Counter row {row!r} vanished while it was being advanced.")
