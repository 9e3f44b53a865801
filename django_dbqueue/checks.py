"""System checks: configuration mistakes reported with ids django_dbqueue.E/W###."""

from __future__ import annotations

from typing import Any

from django.core import checks

from django_dbqueue.conf import settings


@checks.register("django_dbqueue")
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
    if float(beat) * 2 > float(lease):
        errors.append(
            checks.Error(
                f"DBQUEUE['HEARTBEAT_INTERVAL'] ({beat}) must be at most half of "
                f"DBQUEUE['LEASE_TIMEOUT'] ({lease}), or live workers lose their jobs.",
                hint="Keep LEASE_TIMEOUT at least 3x HEARTBEAT_INTERVAL.",
                id="django_dbqueue.E003",
            )
        )
    return errors
