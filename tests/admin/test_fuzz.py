"""No crafted job-list URL gives a 500 (issue #25, item 6).

Date, number and text lookups with out-of-range years, nan and infinities, huge and
non-ASCII digits, for a view-only staff user, on every database: each answer is 200,
302, 400 or 404.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_dbqueue.models import Job
from tests.admin.test_jobs import CHANGELIST, login, make, staff

pytestmark = pytest.mark.django_db

ALLOWED = {200, 302, 400, 404}

DATE_LOOKUPS = [
    "run_after__year",
    "run_after__month",
    "run_after__day",
    "run_after__week_day",
    "run_after__hour",
    "finished_at__year",
    "finished_at__year__gte",
    "created_at__year__lt",
    "owner_date__iso_year",
    "owner_date__quarter",
    "started_at__date",
    "run_after__gte",
    "run_after__range",
]
NUMBER_LOOKUPS = [
    "timeout",
    "timeout__gt",
    "retry_backoff__gt",
    "retry_backoff__lte",
    "priority",
    "priority__gte",
    "attempts",
    "max_attempts__lt",
    "concurrency_limit",
    "id",
    "id__in",
    "pk__gt",
]
TEXT_LOOKUPS = ["queue", "task", "unique_key__startswith", "concurrency_key", "status", "owner"]
VALUES = [
    "10000",
    "9999",
    "1",
    "99999999999",
    "-1",
    "0",
    "-99999999999",
    "9" * 400,
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e999",
    "-1e999",
    "1e-999",
    "²",
    "١٢٣",  # Arabic-Indic digits
    "\uff11\uff12",  # full-width digits
    "",
    " 1",
    "1.5",
    "abc",
    "2024-13-45",
    "9999-12-31 23:59:59",
    "0000-00-00",
    "-0001-01-01",
    "10000-01-01",
    "1,2",
    "1,nan",
]


@pytest.fixture
def viewer() -> Client:
    make(Job.Status.FAILED, timeout=5.0, retry_backoff=1.0, unique_key="k", concurrency_key="c")
    return login(staff("viewer", "view_job"))


@pytest.mark.parametrize("lookup", DATE_LOOKUPS + NUMBER_LOOKUPS + TEXT_LOOKUPS)
def test_crafted_lookups_never_give_a_500(viewer: Client, lookup: str) -> None:
    answers = {
        value: viewer.get(reverse(CHANGELIST), {lookup: value}).status_code for value in VALUES
    }
    assert {v: s for v, s in answers.items() if s not in ALLOWED} == {}


@pytest.mark.parametrize("hierarchy", ["run_after__year", "run_after__month", "run_after__day"])
def test_crafted_date_hierarchy_never_gives_a_500(viewer: Client, hierarchy: str) -> None:
    answers = {
        value: viewer.get(
            reverse(CHANGELIST),
            {"run_after__year": "2024", "run_after__month": "1", hierarchy: value},
        ).status_code
        for value in VALUES
    }
    assert {v: s for v, s in answers.items() if s not in ALLOWED} == {}
