"""Routers of docs/databases.md. QueueRouter: django-dbqueue's tables live in the "queue"
database (settings.py installs it when DBQUEUE_QUEUE_DB=1: tests/test_second_database.py).
ReplicaRouter: every read goes to "replica", every write to "default" (DBQUEUE_TEST_REPLICA=1
and DBQUEUE_READ_REPLICA=1: tests/replica/).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model

QUEUE_APP = "django_dbqueue"
QUEUE_DB = "queue"


class QueueRouter:
    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return QUEUE_DB if model._meta.app_label == QUEUE_APP else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return QUEUE_DB if model._meta.app_label == QUEUE_APP else None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        # The queue's tables only in "queue", and nothing else there: without the second
        # rule `migrate --database queue` would copy every other app's tables into it.
        if app_label == QUEUE_APP:
            return db == QUEUE_DB
        if db == QUEUE_DB:
            return False
        return None


class ReplicaRouter:
    """A project that reads from a replica: every model's reads, the queue's included."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return "replica"

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return "default"

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        return True

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        return db == "default"  # the replica gets the tables from the primary
