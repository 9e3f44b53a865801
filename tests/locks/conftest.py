"""Fixtures of the named-lock tests: this run's backend, a fresh lock name."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from django.test import override_settings

BACKEND_OF_RUN = {"sqlite": "redis", "mysql": "mysql", "postgres": "postgres"}


@pytest.fixture
def backend() -> Iterator[str]:
    """This run's lock backend, also made the configured default."""
    name = BACKEND_OF_RUN[os.environ.get("DBQUEUE_DB", "sqlite")]
    from django.conf import settings

    with override_settings(DBQUEUE={**settings.DBQUEUE, "LOCK_BACKEND": name}):
        yield name


@pytest.fixture
def lock_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"
