"""A shared counter with wrap-around: the next id in [min_value, max_value], atomically.

On Redis it is one Lua script (INCR, wrapping to ``min_value`` past ``max_value``); on the
database one ``UPDATE ... SET value = CASE ... END`` on the ``dbqueue_counter`` row, read
back in the same transaction, never a read-then-write.

Rows are named so that two counters share a row only when their names are equal, under
any collation (MySQL's default ones ignore case, trailing spaces and control characters),
and no counter reaches the fencing tokens of a lock (see :func:`counter_row`).
"""

from __future__ import annotations

import re

from django.db import connections, router, transaction
from django.db.models import Case, F, Q, Value, When

from django_dbqueue.locks.named import default_backend_name
from django_dbqueue.locks.names import readable, tagged_digest

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

# Row names kept as they are: the same string under every collation, no "~" (which every
# hashed row has), and short enough for the 255-character column.
PLAIN_ROW = re.compile(r"[a-z0-9_.:-]{1,255}\Z")
FENCE = "fence:"

# One autocommit statement that adds one to a dbqueue_counter row (made at 1) and gives
# the new value back, per vendor; MySQL hands it back through LAST_INSERT_ID(expr), to
# this session only. The fencing tokens of the database locks, and the epochs of Redis's.
FENCE_UPSERT = {
    "mysql": (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, LAST_INSERT_ID(1)) "
        "ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)"
    ),
    "postgresql": (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, 1) "
        "ON CONFLICT (name) DO UPDATE SET value = dbqueue_counter.value + 1 RETURNING value"
    ),
    "sqlite": (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, 1) "
        "ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value"
    ),
}
MYSQL_READ_BACK = "SELECT LAST_INSERT_ID()"


def counter_row(name: str, *, fencing: bool = False) -> str:
    """The ``dbqueue_counter`` row of counter ``name`` (``fencing``: of the fencing tokens
    of the lock whose full name is ``name``).

    A fencing row is ``fence:<full name>`` and a counter's is its name when that is plain
    (lower-case ASCII letters, digits, ``_.:-``); a counter named ``fence:...`` never is.
    Every other name becomes a readable part, ``~`` and the SHA-256 of the name tagged with
    its kind, so neither kind can reach the other's rows.
    """
    plain = FENCE + name if fencing else name
    if PLAIN_ROW.match(plain) and (fencing or not name.startswith(FENCE)):
        return plain
    digest = tagged_digest("fence" if fencing else "counter", name)
    return f"{readable(plain, 255 - 1 - len(digest))}~{digest}"


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


def durable_increment(alias: str, row: str) -> int:
    """Add one to ``dbqueue_counter`` row ``row`` of database ``alias`` and return the new
    value, on a connection of its own in autocommit: the value is committed when this
    returns, whatever transaction the caller is in (it never rolls back with it)."""
    connection = connections.create_connection(alias)
    try:
        vendor = connection.vendor
        with connection.cursor() as cursor:
            cursor.execute(FENCE_UPSERT[vendor], [row])
            if vendor == "mysql":
                cursor.execute(MYSQL_READ_BACK)
            found = cursor.fetchone()
        assert found is not None
        return int(found[0])
    finally:
        connection.close()


def database_counter_next(row: str, min_value: int, max_value: int, using: str | None) -> int:
    from django_dbqueue.models import Counter

    alias = using or router.db_for_write(Counter)
    rows = Counter.objects.using(alias).filter(name=row)
    advance = Case(
        When(Q(value__gte=max_value) | Q(value__lt=min_value), then=Value(min_value)),
        default=F("value") + 1,
    )
    for _ in range(2):
        with transaction.atomic(using=alias):
            if rows.update(value=advance):
                # Our UPDATE holds the row lock until commit: this reads our own value.
                return int(rows.values_list("value", flat=True).get())
        # First use: create the row outside that transaction (no gap-lock deadlock between
        # two first users on InnoDB), one below min_value so the UPDATE yields min_value.
        Counter.objects.using(alias).get_or_create(name=row, defaults={"value": min_value - 1})
    raise RuntimeError(f"Counter row {row!r} vanished while it was being advanced.")
