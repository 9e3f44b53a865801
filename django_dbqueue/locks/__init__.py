"""Named locks across processes and hosts (Redis, MySQL/MariaDB, PostgreSQL) and a
shared wrap-around counter. See docs/locks.md."""

from django_dbqueue.exceptions import (
    LockBackendUnavailable,
    LockConfigurationError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockReleasedBeforeCommit,
    LockReleasedBeforeCommitWarning,
)
from django_dbqueue.locks.base import BaseLock
from django_dbqueue.locks.counters import next_counter_value
from django_dbqueue.locks.named import get_backend, named_lock

__all__ = [
    "BaseLock",
    "LockBackendUnavailable",
    "LockConfigurationError",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotHeld",
    "LockReleasedBeforeCommit",
    "LockReleasedBeforeCommitWarning",
    "get_backend",
    "named_lock",
    "next_counter_value",
]
