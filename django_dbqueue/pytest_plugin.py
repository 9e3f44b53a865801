"""The pytest fixture of django_dbqueue.testing, for projects tested with pytest-django.

Load it from the project's ``conftest.py``: ``pytest_plugins = ["django_dbqueue.pytest_plugin"]``
(after pytest-django has set Django up, which it does before conftest files load).
"""

from __future__ import annotations

from typing import Any

import pytest

from django_dbqueue.testing import run_due_jobs as _run_due_jobs

__all__ = ["run_due_jobs"]


@pytest.fixture
def run_due_jobs(db: Any) -> Any:
    """:func:`django_dbqueue.testing.run_due_jobs`, with the test database set up
    (pytest-django's ``db``): ``outcomes = run_due_jobs(tasks=[send_mail])``."""
    return _run_due_jobs
