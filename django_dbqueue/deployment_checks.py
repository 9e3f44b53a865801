"""System checks of the deployment around the queue: where the queue tables' reads go
(a replica that lags is wrong for every read that decides something: E007), the
cross-database enqueue mode (E008), and Galera nodes (I110, E111, W111).
:mod:`django_dbqueue.checks` registers them."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError, connections, router

from django_dbqueue.conf import settings
from django_dbqueue.models import ConcurrencyKey, Duty, Job, QueueState, ScheduleTick, WorkerProcess
from django_dbqueue.queue.dialects.galera import RECOMMENDED, node_settings, wsrep_on

QUEUE_MODELS = (Job, WorkerProcess, QueueState, ScheduleTick, Duty, ConcurrencyKey)
CROSS_DATABASE_MODES = ("warn", "raise", "ignore")


def check_queue_reads(**kwargs: Any) -> list[checks.CheckMessage]:
    """E007: a router sends the queue tables' reads to another alias than their writes
    (a replica): pauses, cancellations and a dead child's jobs would be read from the
    past. E008: CROSS_DATABASE_ENQUEUE is not one of its modes."""
    errors: list[checks.CheckMessage] = []
    safe = set(settings.SAFE_READ_ALIASES or [])
    for model in QUEUE_MODELS:
        read, write = router.db_for_read(model), router.db_for_write(model)
        if read != write and read not in safe:
            errors.append(
                checks.Error(
                    f"The database router sends reads of {model._meta.label} to {read!r} "
                    f"and its writes to {write!r}. A replica that lags would keep paused "
                    "queues running, miss cancellations and leave a dead worker's jobs "
                    "waiting for their lease.",
                    hint=f"Route the queue's tables to {write!r} for reads too, or, if "
                    f"{read!r} never lags behind it, add it to DBQUEUE['SAFE_READ_ALIASES'].",
                    obj=model,
                    id="django_dbqueue.E007",
                )
            )
    if settings.CROSS_DATABASE_ENQUEUE not in CROSS_DATABASE_MODES:
        errors.append(
            checks.Error(
                "DBQUEUE['CROSS_DATABASE_ENQUEUE'] must be one of "
                f"{', '.join(CROSS_DATABASE_MODES)}.",
                id="django_dbqueue.E008",
            )
        )
    return errors


def check_galera(
    databases: Any = None, deploy: bool = False, **kwargs: Any
) -> list[checks.CheckMessage]:
    """On a Galera node (``@@wsrep_on``): what is supported, what is node-local, and the
    lock backend that cannot work there. Asks the server, so only for ``check
    --database <alias>`` (and ``migrate``) or ``check --deploy``."""
    found: list[checks.CheckMessage] = []
    aliases = {router.db_for_write(Job), settings.LOCK_DATABASE_ALIAS}
    for alias in sorted(a for a in aliases if a in connections):
        if not deploy and alias not in (databases or ()):
            continue
        conn = connections[alias]
        try:
            if not wsrep_on(conn):
                continue
            values = node_settings(conn)
        except DatabaseError:
            continue  # an unreachable database is not this check's to report
        found.append(galera_info(alias, values))
        if settings.LOCK_BACKEND == "mysql" and alias == settings.LOCK_DATABASE_ALIAS:
            found.append(
                checks.Error(
                    f"DBQUEUE['LOCK_BACKEND'] is 'mysql' but database {alias!r} is a Galera "
                    "node: GET_LOCK is local to one node, two holders on two nodes would both "
                    "hold the lock.",
                    hint="Use 'galera' (the default there when LOCK_BACKEND is unset) or 'redis'.",
                    id="django_dbqueue.E111",
                )
            )
        found.extend(
            checks.Warning(
                f"Galera node {alias!r} runs with {name}={values.get(name)}; the queue is "
                f"tested with {name}={wanted}.",
                hint="See docs/databases.md, 'MariaDB Galera Cluster'.",
                id="django_dbqueue.W111",
            )
            for name, wanted in RECOMMENDED.items()
            if values.get(name) != wanted
        )
    return found


def galera_info(alias: str, values: dict[str, str]) -> checks.CheckMessage:
    return checks.Info(
        f"Database {alias!r} is a MariaDB Galera Cluster node (wsrep_on): supported. The "
        "queue may run on every node (claims, finishes and ticks that lose certification "
        "to another node are retried, counted, logged at DEBUG); named_lock uses the "
        "'galera' backend (lease rows, exclusive across nodes). Node-local: GET_LOCK, row "
        "locks (SKIP LOCKED skips only this node's), LAST_INSERT_ID. An enqueue inside "
        "transaction.atomic() can fail at COMMIT with 1213: retry the transaction, or write "
        "through one node.",
        hint="docs/databases.md, 'MariaDB Galera Cluster'.",
        id="django_dbqueue.I110",
    )
