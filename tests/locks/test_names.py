"""Lock and counter names: two names share a lock, a semaphore slot, fencing tokens or a
counter only when they are equal, and any str is a name.

Each database run tests the lock backend that goes with it (SQLite: Redis, MySQL:
GET_LOCK, PostgreSQL: advisory locks) and both counter backends where they differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from django_dbqueue.conf import settings as dbqueue_settings
from django_dbqueue.locks import LockNotAcquired, named_lock, next_counter_value
from django_dbqueue.locks.counter_rows import counter_row
from django_dbqueue.locks.mysql import MAX_NAME, get_lock_name
from django_dbqueue.locks.postgres import advisory_key
from django_dbqueue.locks.redis import EPOCH_BITS, redis_client, redis_key

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_KINDS = ("mutex", "semaphore", "fence", "counter")


@pytest.fixture
def forget() -> Iterator[Callable[..., None]]:
    """Delete the Redis keys of these names now and after the test: the tests use the
    exact names of the issue, and the Redis server outlives test runs."""
    names: list[str] = []

    def delete() -> None:
        keys = [redis_key(kind, name) for name in names for kind in REDIS_KINDS]
        if keys:
            redis_client().delete(*keys)

    def register(*more: str) -> None:
        names.extend(more)
        delete()

    yield register
    delete()


def first_token(backend: str) -> int:
    """A fresh name's first fencing token: Redis's carry their epoch (the first, 1, from
    the emptied dbqueue_counter) in their high bits."""
    return (1 << EPOCH_BITS) + 1 if backend == "redis" else 1


def counter_kinds(backend: str) -> list[str]:
    return ["database", "redis"] if backend == "redis" else ["database"]


def assert_busy(name: str, **options: object) -> None:
    with pytest.raises(LockNotAcquired):
        with named_lock(name, blocking=False, **options):
            pass


# A short name shaped like a hashed long one -----------------------------------------------


def test_a_name_shaped_like_a_hashed_long_name_is_another_lock(
    backend: str, forget: Callable[..., None]
) -> None:
    victim = "export:" + "v" * 80
    full = dbqueue_settings.LOCK_PREFIX + victim
    # What GET_LOCK used to be given for a long name: a user could choose exactly that.
    hashed = f"{full[:23]}~{hashlib.sha256(full.encode()).hexdigest()[:40]}"
    attacker = hashed.removeprefix(dbqueue_settings.LOCK_PREFIX)
    assert attacker.startswith("export:") and len(dbqueue_settings.LOCK_PREFIX + attacker) == 64
    forget(victim, attacker)
    with named_lock(victim, blocking=False):
        with named_lock(attacker, blocking=False) as other:
            assert other.owned()
        assert_busy(victim)


def test_get_lock_names_are_at_most_64_ascii_characters_for_every_name() -> None:
    for name in ["a", "export:" + "v" * 80, "🔒" * 64, "a\x00b", "\udcff", "Ab "]:
        for slot in [None, 0, 7]:
            key = get_lock_name(dbqueue_settings.LOCK_PREFIX + name, slot)
            assert len(key) <= MAX_NAME and key.isascii() and key.isprintable(), key


# Semaphore slots ---------------------------------------------------------------------------


def test_slot_0_of_semaphore_x_leaves_mutex_x_0_free(
    backend: str, forget: Callable[..., None]
) -> None:
    forget("x", "x:0")
    with named_lock("x", limit=2, blocking=False) as first_slot:
        with named_lock("x:0", blocking=False) as mutex:
            assert mutex.owned() and first_slot.owned()
            with named_lock("x", limit=2, blocking=False) as second_slot:
                assert second_slot.owned()
                assert_busy("x", limit=2)


def test_mutexes_x_0_and_x_1_leave_semaphore_x_both_slots(
    backend: str, forget: Callable[..., None]
) -> None:
    forget("x", "x:0", "x:1")
    with named_lock("x:0", blocking=False), named_lock("x:1", blocking=False):
        with (
            named_lock("x", limit=2, blocking=False) as one,
            named_lock("x", limit=2, blocking=False) as two,
        ):
            assert one.owned() and two.owned()
            assert_busy("x", limit=2)


def test_slot_keys_are_apart_from_every_mutex_key() -> None:
    full = dbqueue_settings.LOCK_PREFIX + "x"
    for slot in range(3):
        mutex = full + f":{slot}"
        assert get_lock_name(full, slot) != get_lock_name(mutex, None)
        assert advisory_key(full, slot) != advisory_key(mutex, None)
    assert redis_key("semaphore", "x") != redis_key("mutex", "x:0")


# Fencing counters ------------------------------------------------------------------------


def test_a_public_counter_cannot_rewind_fencing_tokens(
    backend: str, forget: Callable[..., None]
) -> None:
    forget("acct", "fence:dbqueue:lock:acct")
    assert dbqueue_settings.LOCK_PREFIX == "dbqueue:lock:"
    tokens = []
    for _ in range(3):
        with named_lock("acct", fencing=True) as lock:
            tokens.append(lock.fencing_token)
    assert tokens == [first_token(backend) + n for n in range(3)]
    for kind in counter_kinds(backend):
        next_counter_value("fence:dbqueue:lock:acct", max_value=1, backend=kind)
    with named_lock("acct", fencing=True) as lock:
        assert lock.fencing_token == first_token(backend) + 3


def test_a_counter_shaped_like_a_hashed_fencing_row_stays_a_counter() -> None:
    long_lock = dbqueue_settings.LOCK_PREFIX + "acct" + "x" * 300
    fence_row = counter_row(long_lock, fencing=True)
    assert counter_row(fence_row) != fence_row
    assert counter_row("fence:dbqueue:lock:acct") != counter_row("dbqueue:lock:acct", fencing=True)


def test_fencing_tokens_of_names_differing_in_case_are_apart(
    backend: str, forget: Callable[..., None]
) -> None:
    # MySQL's default collations would compare the counter rows "...acct" and "...ACCT"
    # as equal, so both locks would have drawn from one counter.
    forget("acct", "ACCT")
    with named_lock("acct", fencing=True) as lower:
        assert lower.fencing_token == first_token(backend)
    with named_lock("ACCT", fencing=True) as upper:
        assert upper.fencing_token == first_token(backend)


# Counters --------------------------------------------------------------------------------


def test_redis_counter_starts_at_min_value_like_the_database(
    backend: str, forget: Callable[..., None]
) -> None:
    forget("a")
    for kind in counter_kinds(backend):
        drawn = [next_counter_value("a", min_value=0, max_value=2, backend=kind) for _ in range(4)]
        assert drawn == [0, 1, 2, 0], kind


def test_counters_wrap_exactly_at_the_top_of_bigint(
    backend: str, forget: Callable[..., None]
) -> None:
    # Lua numbers are doubles: 2**63 - 2 and 2**63 - 1 would look the same to them.
    forget("top")
    top = 2**63 - 1
    for kind in counter_kinds(backend):
        drawn = [
            next_counter_value("top", min_value=top - 2, max_value=top, backend=kind)
            for _ in range(4)
        ]
        assert drawn == [top - 2, top - 1, top, top - 2], kind


def test_counters_wrap_in_a_negative_range(backend: str, forget: Callable[..., None]) -> None:
    forget("neg")
    for kind in counter_kinds(backend):
        drawn = [
            next_counter_value("neg", min_value=-12, max_value=-10, backend=kind) for _ in range(4)
        ]
        assert drawn == [-12, -11, -10, -12], kind


@pytest.mark.parametrize(
    ("first", "second"),
    [("Shard", "shard"), ("a", "a "), ("ab", "a\x1fb"), ("a\x00b", "a\x00c")],
    ids=["case", "trailing-space", "control-character", "nul"],
)
def test_counters_whose_names_differ_are_apart(
    backend: str, forget: Callable[..., None], first: str, second: str
) -> None:
    # MySQL's default collations ignore case, trailing spaces and control characters;
    # MySQL and PostgreSQL cannot store or compare NUL.
    forget(first, second)
    for kind in counter_kinds(backend):
        assert next_counter_value(first, backend=kind) == 1
        assert next_counter_value(second, backend=kind) == 1
        assert next_counter_value(first, backend=kind) == 2


# Any str is a name -----------------------------------------------------------------------


def emoji_name() -> str:
    """A name whose full name is 64 characters, 51 of them emoji: 217 bytes, more than the
    192 MariaDB takes, and short enough that the old mapping sent it unhashed."""
    return "🔒" * (MAX_NAME - len(dbqueue_settings.LOCK_PREFIX))


def test_a_64_character_name_of_emoji_is_a_lock(backend: str, forget: Callable[..., None]) -> None:
    name = emoji_name()
    forget(name)
    with named_lock(name, blocking=False, fencing=True) as lock:
        assert lock.owned() and lock.fencing_token == first_token(backend)
        assert_busy(name)


def test_a_nul_in_a_fencing_lock_name_works(backend: str, forget: Callable[..., None]) -> None:
    forget("a\x00b")
    tokens = []
    for _ in range(2):
        with named_lock("a\x00b", blocking=False, fencing=True) as lock:
            assert lock.owned()
            tokens.append(lock.fencing_token)
    assert tokens == [first_token(backend), first_token(backend) + 1]


def test_names_differing_after_a_nul_are_two_locks(
    backend: str, forget: Callable[..., None]
) -> None:
    # GET_LOCK would cut both names at the NUL and hand out one lock.
    forget("a\x00b", "a\x00c")
    with named_lock("a\x00b", blocking=False, fencing=True) as first:
        with named_lock("a\x00c", blocking=False, fencing=True) as second:
            assert first.owned() and second.owned()
            assert first.fencing_token == second.fencing_token == first_token(backend)


def test_a_name_with_a_lone_surrogate_works(backend: str, forget: Callable[..., None]) -> None:
    name = "report-\udcff"  # what os.fsdecode() makes of a file name that is not UTF-8
    forget(name)
    with named_lock(name, blocking=False, fencing=True) as lock:
        assert lock.owned() and lock.fencing_token == first_token(backend)
        assert_busy(name)
    assert next_counter_value(name, backend="database") == 1


def test_names_differing_only_in_case_or_trailing_space_are_two_locks(
    backend: str, forget: Callable[..., None]
) -> None:
    forget("Export", "export", "export ")
    with (
        named_lock("Export", blocking=False) as a,
        named_lock("export", blocking=False) as b,
        named_lock("export ", blocking=False) as c,
    ):
        assert a.owned() and b.owned() and c.owned()


@pytest.mark.only_vendor("mysql")
def test_get_lock_is_given_the_mapped_name() -> None:
    with named_lock(emoji_name(), backend="mysql") as lock:
        assert len(lock.full_name) == MAX_NAME
        with connection.cursor() as cursor:
            cursor.execute("SELECT IS_USED_LOCK(%s)", [get_lock_name(lock.full_name, None)])
            row = cursor.fetchone()
        assert row is not None and row[0] is not None
