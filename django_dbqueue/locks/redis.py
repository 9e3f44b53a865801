"""Redis locks through a django-redis connection.

A mutex is one ``SET key token NX PX ttl``; release and extend compare the token in the
same Lua script that deletes or extends, so a holder whose lease ran out can never remove
or prolong the next holder's key. A semaphore is a sorted set of holder tokens scored by
their expiry (Redis server time, so clocks of the clients do not matter), pruned and added
to in one script. Keys: ``<LOCK_PREFIX>mutex:<name>``, ``semaphore:<name>``, ``fence:<name>``
and, for :func:`next_counter_value`, ``counter:<name>``: the kind right after the prefix
keeps each kind's keys apart (a mutex named ``x:fence`` is still ``mutex:x:fence``), and a
semaphore is one key, not one per slot. Keys are bytes, so any str is a name.

Fencing tokens are ``epoch << 32`` plus the count in the fence key, the epoch drawn from
the lock database whenever the fence key is missing (first use, a restart without
persistence, an eviction): they never go backwards. A server that cannot be reached
raises :class:`LockBackendUnavailable` (the lock fails closed).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings as django_settings
from django.core.cache import InvalidCacheBackendError
from django.db import connections

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import LockConfigurationError
from django_dbqueue.locks.base import BaseLock
from django_dbqueue.locks.counter_rows import counter_row, durable_increment
from django_dbqueue.locks.names import encode

try:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    UNREACHABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
except ImportError:  # redis_client() explains what to install
    UNREACHABLE = ()

REDIS_CACHE_BACKEND = "django_redis.cache.RedisCache"

# Milliseconds of Redis server time, for the semaphore's expiry scores.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Fencing tokens survive a Redis that restarts without persistence (or evicts the key):
# a missing fence key (-2 below, before anything is taken) is seeded with a new epoch
# drawn from the lock database, shifted left by EPOCH_BITS, so every token after the
# restart is larger than every token before it. Lua numbers are doubles: tokens stay
# exact below 2**53, i.e. for 2**21 epochs of 2**32 acquisitions each.
EPOCH_BITS = 32
NO_FENCE = -2
_FENCE_MISSING = """
if ARGV[%d] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return -2 end
"""

# Returns 0 when busy, -1 when acquired without fencing, -2 when the fence key must be
# seeded first (nothing taken), else the new fencing token.
MUTEX_ACQUIRE = (
    _FENCE_MISSING % 3
    + """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if ARGV[3] == '1' then return redis.call('INCR', KEYS[2]) end
return -1
"""
)
MUTEX_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
MUTEX_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
SEMAPHORE_ACQUIRE = (
    _FENCE_MISSING % 4
    + _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if ARGV[4] == '1' then return redis.call('INCR', KEYS[2]) end
return -1
"""
)
# A token whose score is in the past is expired even if not pruned yet: not ours any more.
SEMAPHORE_RELEASE = (
    _NOW
    + """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
if score and tonumber(score) > now then return 1 end
return 0
"""
)
SEMAPHORE_EXTEND = (
    _NOW
    + """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
    redis.call('ZREM', KEYS[1], ARGV[1])
    return 0
end
if ARGV[2] == '0' then return 1 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""
)
# KEYS[1]: the counter; ARGV[1], ARGV[2]: min_value and max_value. A missing counter (or
# one at or past max_value, or below min_value) becomes min_value, as the database's does.
# Values stay decimal strings: Lua numbers are doubles, exact only up to 2**53.
COUNTER_NEXT = """
local function less(a, b)
    local neg_a, neg_b = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
    if neg_a ~= neg_b then return neg_a end
    if a == b then return false end
    local smaller = (#a < #b) or (#a == #b and a < b)
    if neg_a then return not smaller end
    return smaller
end
local v = redis.call('GET', KEYS[1])
if v and not less(v, ARGV[1]) and less(v, ARGV[2]) then
    redis.call('INCR', KEYS[1])
    return redis.call('GET', KEYS[1])
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


def redis_client(alias: str | None = None) -> Any:
    """The redis-py client behind the django-redis cache ``alias``."""
    name = alias or settings.LOCK_REDIS_ALIAS
    try:
        from django_redis import get_redis_connection
    except ImportError:
        raise LockConfigurationError(
            'Redis locks need django-redis (pip install "django-dbqueue[redis]")'
            + other_backend_advice()
        ) from None
    try:
        return get_redis_connection(name)
    except (NotImplementedError, InvalidCacheBackendError):
        # django-redis says only "This backend does not support this feature".
        source = f"using={name!r}" if alias else f"DBQUEUE['LOCK_REDIS_ALIAS'] is {name!r}"
        config = django_settings.CACHES.get(name)
        if config is None:
            problem = f"{source} and CACHES has no {name!r}: add CACHES[{name!r}]"
        else:
            problem = f"{source}, whose BACKEND is {config.get('BACKEND')!r}: point it at a cache"
        raise LockConfigurationError(
            f"Redis locks need a django-redis cache, but {problem} with BACKEND "
            f"{REDIS_CACHE_BACKEND!r}" + other_backend_advice()
        ) from None


def other_backend_advice() -> str:
    """The end of a configuration error: the lock database's own locks, where it has some."""
    alias = settings.LOCK_DATABASE_ALIAS
    vendor = connections[alias].vendor if alias in connections else "not configured"
    own = {"mysql": "mysql", "postgresql": "postgres"}.get(vendor)
    if own:
        return (
            f", or set DBQUEUE['LOCK_BACKEND'] to {own!r} to use the locks of database {alias!r}."
        )
    return f" (database {alias!r} is {vendor}, which has no locks of its own)."


def redis_key(kind: str, name: str) -> bytes:
    """The key of ``kind`` ("mutex", "semaphore", "fence" or "counter") for ``name``."""
    return encode(f"{settings.LOCK_PREFIX}{kind}:{name}")


def redis_counter_next(name: str, min_value: int, max_value: int, using: str | None) -> int:
    script = redis_client(using).register_script(COUNTER_NEXT)
    return int(script(keys=[redis_key("counter", name)], args=[min_value, max_value]))


class RedisLock(BaseLock):
    backend_name = "redis"
    expires = True

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.client = redis_client(self.using)
        # A fresh random token per acquisition: two holders never share one, even in the
        # same thread, so release/extend by one can never act on the other's lock.
        self.token = uuid.uuid4().hex
        kind = "mutex" if self.limit == 1 else "semaphore"
        self.key = redis_key(kind, name)
        self.fence_key = redis_key("fence", name)

    def _run(self, source: str, keys: list[bytes], *args: object) -> int:
        try:
            return int(self.client.register_script(source)(keys=keys, args=list(args)))
        except UNREACHABLE as exc:
            raise self.unavailable(exc) from exc

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

    def address(self) -> str:
        params = self.client.connection_pool.connection_kwargs
        if params.get("path"):
            return f"unix:{params['path']}"
        return f"{params.get('host', 'localhost')}:{params.get('port', 6379)}"

    def do_acquire(self) -> bool:
        for _ in range(3):
            result = self._try_acquire()
            if result != NO_FENCE:
                break
            self._seed_fence()
        else:
            raise self.unavailable(RuntimeError("the fence key vanished three times in a row"))
        if result == 0:
            return False
        self.fencing_token = result if result > 0 else None
        return True

    def _try_acquire(self) -> int:
        fencing = "1" if self.fencing else "0"
        if self.limit == 1:
            keys = [self.key, self.fence_key]
            return self._run(MUTEX_ACQUIRE, keys, self.token, self._ms(self.timeout), fencing)
        return self._run(
            SEMAPHORE_ACQUIRE,
            [self.key, self.fence_key],
            self.token,
            self._ms(self.timeout),
            self.limit,
            fencing,
        )

    def _seed_fence(self) -> None:
        """Start the fence key at a new epoch from the lock database (durable: it only
        grows), unless another holder seeded it first."""
        row = counter_row(self.full_name, fencing=True)
        epoch = durable_increment(settings.LOCK_DATABASE_ALIAS, row)
        try:
            self.client.set(self.fence_key, epoch << EPOCH_BITS, nx=True)
        except UNREACHABLE as exc:
            raise self.unavailable(exc) from exc

    def do_release(self) -> bool:
        source = MUTEX_RELEASE if self.limit == 1 else SEMAPHORE_RELEASE
        return self._run(source, [self.key], self.token) == 1

    def do_extend(self, seconds: float) -> bool:
        source = MUTEX_EXTEND if self.limit == 1 else SEMAPHORE_EXTEND
        return self._run(source, [self.key], self.token, self._ms(seconds)) == 1

    def do_owned(self) -> bool:
        if self.limit == 1:
            try:
                return bool(self.client.get(self.key) == self.token.encode())
            except UNREACHABLE as exc:
                raise self.unavailable(exc) from exc
        return self._run(SEMAPHORE_EXTEND, [self.key], self.token, 0) == 1
