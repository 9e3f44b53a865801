"""Fixtures the admin tests share."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.admin.test_jobs import login, staff


@pytest.fixture
def operator() -> Client:
    """A staff user who may view, change and delete jobs (the admin's repair actions).
    Modules that test a narrower operator define their own."""
    return login(staff("operator", "view_job", "change_job", "delete_job"))
