"""System checks: configuration mistakes reported with ids django_dbqueue.E/W###, and what a
Galera node supports (I110)."""

from __future__ import annotations

import difflib
from functools import partial
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.db import connections, router

from django_dbqueue import bounds, registry
from django_dbqueue.conf import DEFAULTS, settings
from django_dbqueue.deployment_checks import check_galera, check_queue_reads
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.locks.named import BACKENDS, RELEASE_MODES
from django_dbqueue.models import Counter
from django_dbqueue.queue import ratelimits
from django_dbqueue.scheduling.checks import check_schedules

HEARTBEATS_PER_LEASE = 3


def check_queue_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    queues = settings.QUEUES
    if (
        not isinstance(queues, list | tuple)
        or not queues
        or not all(isinstance(q, str) and q and len(q) <= 64 for q in queues)
    ):
        errors.append(
            checks.Error(
                "DBQUEUE['QUEUES'] must be a non-empty list of queue names (1-64 characters).",
                hint="For example DBQUEUE = {'QUEUES': ['default', 'emails']}.",
                id="django_dbqueue.E001",
            )
        )
    elif settings.DEFAULT_QUEUE not in queues:
        errors.append(
            checks.Error(
                f"DBQUEUE['DEFAULT_QUEUE'] ({settings.DEFAULT_QUEUE!r}) is not in "
                "DBQUEUE['QUEUES'].",
                hint="Add it to QUEUES or choose one of them as DEFAULT_QUEUE.",
                id="django_dbqueue.E002",
            )
        )
    lease, beat = settings.LEASE_TIMEOUT, settings.HEARTBEAT_INTERVAL
    # Three heartbeats per lease: one late heartbeat (a slow write, a retried connection)
    # must not let a live worker's job expire and run a second time elsewhere.
    if float(beat) * HEARTBEATS_PER_LEASE > float(lease) * (1 + 1e-9):
        errors.append(
            checks.Error(
                f"DBQUEUE['HEARTBEAT_INTERVAL'] ({beat}) must be at most a third of "
                f"DBQUEUE['LEASE_TIMEOUT'] ({lease}), or a live worker whose heartbeat is "
                "late loses its jobs to another worker.",
                hint=f"Set LEASE_TIMEOUT to at least 3x HEARTBEAT_INTERVAL "
                f"({float(beat) * HEARTBEATS_PER_LEASE:g} or more), or lower HEARTBEAT_INTERVAL.",
                id="django_dbqueue.E003",
            )
        )
    return errors


def check_setting_names(**kwargs: Any) -> list[checks.CheckMessage]:
    """Every key of ``DBQUEUE`` must be a known setting: a misspelled one would be ignored."""
    user = getattr(django_settings, "DBQUEUE", None) or {}
    if not isinstance(user, dict):
        return []  # the other checks and every setting read report this
    errors: list[checks.CheckMessage] = []
    for key in user:
        if key in DEFAULTS:
            continue
        close = difflib.get_close_matches(str(key).upper(), DEFAULTS, n=1, cutoff=0.6)
        if close:
            message = (
                f"DBQUEUE[{key!r}] is not a django-dbqueue setting; did you mean {close[0]!r}?"
            )
            hint = f"Rename {key!r} to {close[0]!r}: an unknown key is ignored."
        else:
            message = f"DBQUEUE[{key!r}] is not a django-dbqueue setting."
            hint = "The settings are: " + ", ".join(DEFAULTS) + "."
        errors.append(checks.Error(message, hint=hint, id="django_dbqueue.E004"))
    return errors


REDIS_CACHE_BACKEND = "django_redis.cache.RedisCache"
DATABASE_LOCK_VENDORS = {"mysql": "mysql", "postgres": "postgresql"}


def check_lock_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    """The configured lock backend must be able to work with the configured servers."""
    errors: list[checks.CheckMessage] = []
    backend = settings.LOCK_BACKEND
    if settings.LOCK_RELEASE_IN_TRANSACTION not in RELEASE_MODES:
        errors.append(
            checks.Error(
                f"DBQUEUE['LOCK_RELEASE_IN_TRANSACTION'] must be one of {RELEASE_MODES}.",
                hint="'warn' (the default) flags a lock released before its transaction commits.",
                id="django_dbqueue.E101",
            )
        )
    if backend is None:
        # Chosen from the database when first used; a named_lock on a setup with no
        # usable backend then says so. Nothing to hold against projects without locks.
        pass
    elif backend not in BACKENDS and "." not in str(backend):
        errors.append(
            checks.Error(
                f"DBQUEUE['LOCK_BACKEND'] is {backend!r}, not a known lock backend.",
                hint=f"Use one of {', '.join(BACKENDS)} or a dotted path to a BaseLock class.",
                id="django_dbqueue.E102",
            )
        )
    elif backend == "redis":
        errors.extend(check_redis_alias(django_settings.CACHES, settings.LOCK_REDIS_ALIAS))
    elif backend in DATABASE_LOCK_VENDORS:
        alias = settings.LOCK_DATABASE_ALIAS
        vendor = connections[alias].vendor if alias in connections else None
        if vendor != DATABASE_LOCK_VENDORS[backend]:
            errors.append(
                checks.Error(
                    f"DBQUEUE['LOCK_BACKEND'] is {backend!r} but database {alias!r} is "
                    f"{vendor or 'not configured'}: its locks cannot work there.",
                    hint="Use the backend of your database (mysql for MySQL/MariaDB, postgres "
                    "for PostgreSQL) or 'redis', or set DBQUEUE['LOCK_DATABASE_ALIAS'].",
                    id="django_dbqueue.E103",
                )
            )
    alias = settings.LOCK_DATABASE_ALIAS
    database_locks = alias in connections and (
        connections[alias].vendor == DATABASE_LOCK_VENDORS.get(backend, "")
        or (backend is None and connections[alias].vendor in DATABASE_LOCK_VENDORS.values())
    )
    if database_locks:
        errors.extend(check_counter_database(alias))
    return errors


def check_counter_database(alias: str) -> list[checks.CheckMessage]:
    """Database locks write fencing tokens to ``dbqueue_counter`` on their own connection:
    a router that keeps the app's tables in another database leaves them without it."""
    if router.allow_migrate_model(alias, Counter):
        return []
    return [
        checks.Warning(
            f"DBQUEUE['LOCK_DATABASE_ALIAS'] is {alias!r}, but the database router keeps "
            "django_dbqueue's tables out of it: named_lock(fencing=True) needs the "
            "dbqueue_counter table in that database.",
            hint=f"Set LOCK_DATABASE_ALIAS to {router.db_for_write(Counter)!r}, the database "
            "of the queue's tables (see docs/databases.md).",
            id="django_dbqueue.W102",
        )
    ]


def check_redis_alias(caches: dict[str, Any], alias: str) -> list[checks.CheckMessage]:
    try:
        import django_redis  # noqa: F401
    except ImportError:
        return [
            checks.Error(
                "The redis lock backend needs django-redis, which is not installed.",
                hint='pip install "django-dbqueue[redis]", or choose another LOCK_BACKEND.',
                id="django_dbqueue.E104",
            )
        ]
    config = caches.get(alias)
    if config is None or config.get("BACKEND") != REDIS_CACHE_BACKEND:
        found = "missing" if config is None else config.get("BACKEND")
        return [
            checks.Error(
                f"DBQUEUE['LOCK_REDIS_ALIAS'] is {alias!r}, which must be a django-redis cache "
                f"in CACHES (it is {found}).",
                hint=f"Add CACHES[{alias!r}] with BACKEND {REDIS_CACHE_BACKEND!r}, or point "
                "LOCK_REDIS_ALIAS at one.",
                id="django_dbqueue.E105",
            )
        ]
    sharing = [
        other
        for other, other_config in caches.items()
        if other != alias and other_config.get("LOCATION") == config.get("LOCATION")
    ]
    if alias == "default" or sharing:
        return [
            checks.Warning(
                f"The lock cache {alias!r} is also used as a general cache"
                + (f" (same LOCATION as {', '.join(sharing)})" if sharing else "")
                + ": cache.clear() flushes the whole Redis database, locks included, and "
                "eviction under memory pressure can drop a held lock.",
                hint="Give the locks a cache alias of their own on a separate Redis database "
                "(e.g. redis://host:6379/5), never clear() it, and use maxmemory-policy "
                "noeviction or volatile-* for it.",
                id="django_dbqueue.W101",
            )
        ]
    return []


PAYLOAD_MODES = ("change", "view", "none")


def check_task_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    """Task discovery works, registered tasks use known queues, the limits are sane."""
    errors = _check_task_modules()
    size = settings.MAX_PAYLOAD_BYTES
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        errors.append(
            checks.Error(
                "DBQUEUE['MAX_PAYLOAD_BYTES'] must be a positive number of bytes.",
                hint="The default is 1048576 (1 MiB); MySQL's max_allowed_packet must be larger.",
                id="django_dbqueue.E404",
            )
        )
    if settings.ADMIN_SHOW_PAYLOADS not in PAYLOAD_MODES:
        errors.append(
            checks.Error(
                f"DBQUEUE['ADMIN_SHOW_PAYLOADS'] must be one of {', '.join(PAYLOAD_MODES)}.",
                hint="'change' (the default) shows args, kwargs and results to users who may "
                "change jobs only.",
                id="django_dbqueue.E405",
            )
        )
    lanes = settings.ASYNC_CONCURRENCY
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 0:
        errors.append(
            checks.Error(
                "DBQUEUE['ASYNC_CONCURRENCY'] must be a whole number of async jobs >= 0.",
                hint="For example 50: each worker process awaits up to 50 async def jobs at "
                "once (docs/async.md); 0 runs each one alone.",
                id="django_dbqueue.E407",
            )
        )
    for name, check in (
        ("MAX_ATTEMPTS", bounds.check_max_attempts),
        ("JOB_TIMEOUT", bounds.check_timeout),
    ):
        try:
            check(getattr(settings, name))
        except InvalidJob as exc:
            errors.append(
                checks.Error(
                    f"DBQUEUE[{name!r}]: {exc}",
                    hint="Every job would get this value; see docs/security.md for the limits.",
                    id="django_dbqueue.E406",
                )
            )
    return errors


def _check_task_modules() -> list[checks.CheckMessage]:
    """E401-E403: TASK_MODULES is a list, the task modules import, their queues exist."""
    errors: list[checks.CheckMessage] = []
    modules = settings.TASK_MODULES
    if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
        errors.append(
            checks.Error(
                "DBQUEUE['TASK_MODULES'] must be a list of module names.",
                hint="For example DBQUEUE = {'TASK_MODULES': ['myproject.jobs']}.",
                id="django_dbqueue.E401",
            )
        )
    else:
        try:
            tasks = registry.all_tasks()
        except Exception as exc:  # any error of a task module's import is the finding
            errors.append(
                checks.Error(
                    f"Importing the task modules failed: {type(exc).__name__}: {exc}",
                    hint="Workers import every installed app's tasks.py and jobs.py and the "
                    "modules in DBQUEUE['TASK_MODULES'] when they start; fix the import.",
                    id="django_dbqueue.E402",
                )
            )
            tasks = []
        queues = settings.QUEUES if isinstance(settings.QUEUES, list | tuple) else []
        for entry in tasks:
            queue = entry.defaults.get("queue")
            if queue is not None and queue not in queues:
                errors.append(
                    checks.Error(
                        f"Task {entry.path} is declared with @job(queue={queue!r}), which is "
                        "not in DBQUEUE['QUEUES']: every enqueue of it would fail.",
                        hint="Add the queue to DBQUEUE['QUEUES'] or change the task's queue.",
                        id="django_dbqueue.E403",
                    )
                )
    return errors


def check_scheduled_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """DBQUEUE['SCHEDULE'], its tasks looked up in the task registry."""

    def is_registered(path: str) -> bool:
        try:
            registry.find(path)
        except Exception:  # unregistered, or the task modules fail to import (E402)
            return False
        return True

    return check_schedules(app_configs, is_registered=is_registered, **kwargs)


def check_rate_limits(**kwargs: Any) -> list[checks.CheckMessage]:
    """DBQUEUE['RATE_LIMITS'] (docs/workflows.md): its form, and queues that exist."""
    try:
        limits = ratelimits.parse(settings.RATE_LIMITS)
    except ValueError as exc:
        hint = (
            "For example RATE_LIMITS = {'emails': {'limit': 10, 'period': 1}, "
            "'key:api.example.com': {'limit': 5, 'period': 1}}."
        )
        return [checks.Error(str(exc), hint=hint, id="django_dbqueue.E005")]
    queues = settings.QUEUES if isinstance(settings.QUEUES, list | tuple) else []
    return [
        checks.Error(
            f"DBQUEUE['RATE_LIMITS'] names {name!r}, which is not in DBQUEUE['QUEUES'].",
            hint="A rate limit names a queue, or a concurrency key as 'key:NAME': add the "
            "queue, write the key's name with its prefix, or remove the limit.",
            id="django_dbqueue.E006",
        )
        for name in limits
        if name not in queues and not name.startswith(ratelimits.KEY_PREFIX)
    ]


def register() -> None:
    """Register the checks (AppConfig.ready() calls this once)."""
    checks.register(check_setting_names, "django_dbqueue")
    checks.register(check_queue_settings, "django_dbqueue")
    checks.register(check_queue_reads, "django_dbqueue")
    checks.register(check_rate_limits, "django_dbqueue")
    checks.register(check_task_settings, "django_dbqueue")
    checks.register(check_lock_settings, "django_dbqueue")
    checks.register(check_scheduled_tasks, "django_dbqueue")
    checks.register(check_galera, "django_dbqueue", checks.Tags.database)
    checks.register(partial(check_galera, deploy=True), "django_dbqueue", deploy=True)
