"""Settings: one ``DBQUEUE`` dict, read on every access so ``override_settings`` works
(:class:`PerSettings` keeps what hot paths derive from it until it is replaced)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.conf import settings as django_settings

T = TypeVar("T")

DEFAULTS: dict[str, Any] = {
    # Queues that enqueue() and run_jobs accept; anything else is a typo until listed here.
    "QUEUES": ["default"],
    "DEFAULT_QUEUE": "default",
    "DEFAULT_PRIORITY": 0,
    "MAX_ATTEMPTS": 3,
    # Modules that declare tasks, imported by the task discovery besides every installed
    # app's tasks.py and jobs.py. Only registered tasks run (docs/security.md).
    "TASK_MODULES": [],
    # enqueue() refuses a task path its own registry does not know. Turn it off for
    # producers that do not have the workers' code: any well-formed path is then stored,
    # and the workers still fail the jobs whose task they do not have registered.
    "VALIDATE_TASKS": True,
    # Largest JSON of a job's args + kwargs, in bytes (enqueue() refuses bigger ones).
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Who sees a job's args, kwargs and result in the admin: "change" (users who may
    # change jobs), "view" (everyone who may view them) or "none". Tracebacks stay visible.
    "ADMIN_SHOW_PAYLOADS": "change",
    # Worker
    "BATCH_SIZE": 100,  # most jobs one claim takes; fewer when jobs are slow:
    "CLAIM_AHEAD": 0.15,  # a claim takes about this many seconds of work (measured); 0: all
    "POLL_INTERVAL": 1.0,  # longest sleep between polls of an idle queue (seconds)
    "MIN_POLL_INTERVAL": 0.05,  # first sleep after the queue ran dry
    "LEASE_TIMEOUT": 60.0,  # a claimed job whose lease is this old is recovered
    "HEARTBEAT_INTERVAL": 10.0,  # how often a live worker renews its leases
    "JOB_TIMEOUT": None,  # seconds; None = no limit unless the job sets one
    # async def jobs each worker process runs at once on an event loop (run_jobs
    # --async-concurrency overrides); 0: each runs alone on a loop of its own (docs/async.md).
    "ASYNC_CONCURRENCY": 0,
    # Seconds a running job gets to stop by itself (past its timeout, after an operator's
    # cancel, after a second SIGTERM) before the supervisor SIGKILLs its worker process.
    "KILL_GRACE": 5.0,
    "RETRY_BACKOFF": 2.0,  # first retry delay in seconds, doubled per attempt
    "RETRY_BACKOFF_MAX": 3600.0,
    "RETRY_JITTER": 0.2,  # +/- fraction applied to each delay
    "FINISH_BATCH_SIZE": 100,  # finished jobs written together
    "FINISH_FLUSH_INTERVAL": 0.2,  # seconds a finished job may wait before its write
    "KEEP_ERRORS": 10,  # tracebacks of earlier attempts kept per job
    # Locks
    # None: the lock database's own kind (mysql: GET_LOCK, postgresql: advisory locks),
    # else "redis". Set it to choose: "redis", "mysql", "postgres" or a BaseLock path.
    "LOCK_BACKEND": None,
    "LOCK_REDIS_ALIAS": "default",  # django-redis cache alias used by the redis backend
    "LOCK_PREFIX": "dbqueue:lock:",
    "LOCK_DATABASE_ALIAS": "default",  # database alias used by the mysql and postgres backends
    "LOCK_TIMEOUT": 60.0,  # lease in seconds for backends whose locks expire (redis)
    # What to do when a lock is released inside an open transaction: "warn", "raise", "ignore"
    "LOCK_RELEASE_IN_TRANSACTION": "warn",
    # Wake idle workers when jobs are enqueued: LISTEN/NOTIFY on PostgreSQL; elsewhere a
    # Redis channel when WAKEUP_REDIS_ALIAS names a django-redis cache; else polling.
    "WAKEUP": True,
    "WAKEUP_REDIS_ALIAS": None,
    # Database aliases a router may send the queue tables' reads to (check E005 refuses
    # others): only aliases that never lag behind the one the router writes to.
    "SAFE_READ_ALIASES": [],
    # enqueue() inside an atomic() of another alias than the queue's (whose rollback
    # would not take the job back): "warn", "raise" or "ignore".
    "CROSS_DATABASE_ENQUEUE": "warn",
    # Retention: finished jobs older than this (seconds or timedelta; None keeps them) are
    # deleted by the workers, by primary key in small batches. Keys: done, failed,
    # cancelled; a key left out keeps its default (see queue/retention.py).
    "RETENTION": {},
    "RETENTION_INTERVAL": 300.0,  # seconds between prune runs, across the whole cluster
    "PRUNE_BATCH_SIZE": 500,  # rows per DELETE: each statement holds its locks briefly
    # Recurring jobs: {name: {"task": path, "cron": "0 3 * * *" or "every": seconds, ...}};
    # the keys are listed in docs/scheduling.md.
    "SCHEDULE": {},
    # Cluster-wide rate limits (docs/workflows.md): {"queue": {"limit": N, "period": s}},
    # or {"key:NAME": {...}} for the jobs of concurrency key NAME:
    # at most N job starts per period of that queue or key across every worker.
    "RATE_LIMITS": {},
    # Observability (docs/observability.md). METRICS_PORT: run_jobs serves this host's
    # worker metrics on it (--metrics-port overrides; None: no metrics, prometheus_client
    # is never imported).
    "METRICS_PORT": None,
    "METRICS_ADDRESS": "0.0.0.0",  # the interface it listens on ("127.0.0.1": this host only)
    # Seconds the cluster metrics view reuses its figures: each scrape of every replica
    # behind a load balancer would otherwise run its queries.
    "METRICS_CACHE_SECONDS": 15.0,
    # Counts of jobs per queue and status stop here (bounded index reads; docs say so).
    "METRICS_COUNT_LIMIT": 100_000,
    # A bearer token the cluster metrics view requires (None: the project guards the URL).
    "METRICS_TOKEN": None,
    # Carry the enqueuing trace into the job's span when opentelemetry-api is installed;
    # False: it is never imported.
    "TRACING": True,
}


class Settings:
    """Attribute access to ``settings.DBQUEUE`` merged over :data:`DEFAULTS`."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown django-dbqueue setting {name!r}")
        user: dict[str, Any] = getattr(django_settings, "DBQUEUE", {}) or {}
        return user.get(name, DEFAULTS[name])


settings = Settings()


class PerSettings(Generic[T]):
    """``build()``'s value, built again only when one of the named Django settings is a
    new object with other contents (``override_settings`` replaces them; a setting changed
    in place, which Django does not support, goes unseen): for values read on hot paths,
    where reading several keys through :data:`settings` costs more than the work itself.
    """

    def __init__(self, build: Callable[[], T], *names: str) -> None:
        self.build = build
        self.names = names or ("DBQUEUE",)
        self._cached: tuple[list[Any], T] | None = None

    def __call__(self) -> T:
        key = [getattr(django_settings, name, None) for name in self.names]
        cached = self._cached  # one read: another thread may replace it meanwhile
        # The same objects compare equal at once; equal copies give the same value.
        if cached is not None and cached[0] == key:
            return cached[1]
        value = self.build()
        self._cached = (key, value)
        return value
