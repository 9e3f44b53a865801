"""The admin in headless Chromium: an operator finds a failed job, requeues it, sees it run.

Needs Debian's chromium at /usr/bin/chromium (scripts/test.sh installs it). Set
DBQUEUE_DOCS_SCREENSHOT=1 to refresh docs/dashboard.png from the dashboard test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone
from playwright.sync_api import Page, expect, sync_playwright

from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.registry import task_path
from tests.support import ROOT, Processes, jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
S = Job.Status


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Page]:
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # are plain synchronous code all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run scripts/test.sh as root or apt-get install chromium"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            context.set_default_timeout(15_000)
            yield context.new_page()
        finally:
            browser.close()
            # The ORM calls made while Playwright's loop ran got connections of their
            # own (Django keeps them per context); close them or the test database
            # cannot be dropped at the end of the run.
            connections.close_all()


def log_in(page: Page, base_url: str) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "correct horse")
    page.goto(f"{base_url}/admin/login/?next=/admin/django_dbqueue/job/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    expect(page.locator("#changelist")).to_be_visible()


def test_filter_failed_requeue_one_and_see_it_run(
    page: Page,
    live_server: Any,
    processes: Processes,
    worker_env: Callable[..., dict[str, str]],
) -> None:
    add = task_path(jobs.add)
    broken = Job.objects.create(
        task=add,
        args=[20, 22],
        status=S.FAILED,
        attempts=3,
        finished_at=timezone.now(),
        last_error="Traceback (most recent call last):\n"
        "ConnectionError: <script>window.__xss = 1</script>",
    )
    other = Job.objects.create(task=add, args=[1, 1], status=S.FAILED, finished_at=timezone.now())
    Job.objects.create(task=add, args=[0, 0], status=S.DONE, finished_at=timezone.now())
    log_in(page, live_server.url)

    page.locator("#changelist-filter").get_by_role("link", name="Failed", exact=True).click()
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    assert page.evaluate("window.__xss") is None, "the error text is shown, not run"
    expect(page.locator("#result_list")).to_contain_text("ConnectionError: <script>")

    page.check(f"input[name=_selected_action][value='{broken.pk}']")
    page.select_option("select[name=action]", "requeue_jobs_now")
    page.click("button[name=index]")
    expect(page.locator("ul.messagelist")).to_contain_text("Requeued 1 job(s) to run now.")
    expect(rows).to_have_count(1)  # still filtered on "failed": only the other one is left

    worker = processes.run_jobs("--burst", env=worker_env())
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, out

    page.goto(f"{live_server.url}/admin/django_dbqueue/job/{broken.pk}/change/")
    expect(page.locator(".field-status_display")).to_contain_text("Done")
    expect(page.locator(".field-result_display pre")).to_have_text("42")
    expect(page.locator(".field-attempts_display")).to_contain_text("1/3")
    assert other.refresh_status() == S.FAILED


def test_dashboard_renders_with_chart_workers_and_failures(page: Page, live_server: Any) -> None:
    now = timezone.now()
    add = task_path(jobs.add)
    finished = []
    for minute in range(60):
        # A plausible hour: steady work with a burst and a few failures.
        count = 4 + (minute * 7) % 9 + (12 if 20 <= minute < 26 else 0)
        finished += [
            Job(task=add, status=S.DONE, finished_at=now - timedelta(minutes=minute, seconds=i))
            for i in range(count)
        ]
        if minute % 11 == 3:
            finished.append(
                Job(
                    task="testproject.jobs.build_report",
                    queue="reports",
                    status=S.FAILED,
                    attempts=3,
                    finished_at=now - timedelta(minutes=minute),
                    last_error="Traceback (most recent call last):\nRuntimeError: report "
                    "'weekly' failed: the data source is unreachable",
                )
            )
    Job.objects.bulk_create(finished)
    Job.objects.bulk_create(
        Job(task=add, queue="emails", run_after=now - timedelta(minutes=3)) for _ in range(25)
    )
    WorkerProcess.objects.create(
        name="web-1:4242:a1", host="web-1", pid=4242, queues=["default", "emails"], heartbeat_at=now
    )
    WorkerProcess.objects.create(
        name="web-2:977:b2",
        host="web-2",
        pid=977,
        queues=["reports"],
        heartbeat_at=now - timedelta(minutes=20),
    )
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/django_dbqueue/job/")
    page.get_by_role("link", name="Dashboard").click()
    expect(page.locator("h1")).to_have_text("Job queue dashboard")
    assert page.locator("svg.dbq-chart rect").count() >= 60
    expect(page.locator("#workers")).to_contain_text("web-1")
    expect(page.locator("#workers .dbq-dead")).to_have_count(1)
    expect(page.locator("#queues")).to_contain_text("3 min")
    failures = page.locator("#failures tbody tr")
    expect(failures).to_have_count(6)

    target = ROOT / "docs" / "dashboard.png" if os.environ.get("DBQUEUE_DOCS_SCREENSHOT") else None
    shot = page.screenshot(full_page=True, path=target)
    assert shot.startswith(b"\x89PNG") and len(shot) > 10_000

    failures.first.get_by_role("button", name="Requeue").click()
    expect(page.locator("ul.messagelist")).to_contain_text("requeued")
    expect(failures).to_have_count(5)
