"""The router of docs/databases.md: django-dbqueue's tables live in the "queue" database.

settings.py installs it when DBQUEUE_QUEUE_DB=1 (tests/test_second_database.py runs so).
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
