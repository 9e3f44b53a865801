"""The admin in headless Chromium: an operator finds a failed job, requeues it, sees it run;
the app's own pages laid out as the running Django's admin lays out its own, at 1280 px.

Needs Debian's chromium at /usr/bin/chromium (scripts/test.sh installs it). Set
DBQUEUE_DOCS_SCREENSHOT=1 to refresh docs/dashboard.png from the dashboard test (run it
on the newest Django: the screenshot shows its admin).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone
from playwright.sync_api import Page, expect, sync_playwright

from django_dbqueue.admin.jobs import JobAdmin
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
WIDTH = 1280  # the narrowest desktop the admin's own pages must fit without scrolling


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
            context = browser.new_context(viewport={"width": WIDTH, "height": 900})
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


# Every element of the page drawn beyond the viewport's right edge (or left of 0), and every
# box that scrolls sideways because what it holds is wider than it.
OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.querySelectorAll("body *")) {
    const box = el.getBoundingClientRect();
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none" || box.width === 0) continue;
    if (el.classList.contains("skip-to-content-link")) continue;  // off-screen until focused
    const scrolls = ["auto", "scroll"].includes(style.overflowX);
    const sideways = scrolls && el.scrollWidth > el.clientWidth + 1;
    if (box.right > width + 1 || box.left < -1 || sideways) {
      wide.push(`${el.tagName}#${el.id}.${el.className} ${box.left}..${box.right}`);
    }
  }
  return {width, scroll: document.documentElement.scrollWidth, wide};
}"""
# Where the breadcrumbs are drawn and how, next to the header above them.
CRUMBS_JS = """() => {
  const crumbs = document.querySelector("nav > .breadcrumbs");
  const header = document.querySelector("#header").getBoundingClientRect();
  const box = crumbs.getBoundingClientRect();
  const link = crumbs.querySelector("a").getBoundingClientRect();
  const style = getComputedStyle(crumbs);
  return {
    tag: crumbs.tagName, left: box.left, width: Math.round(box.width), top: box.top,
    height: Math.round(box.height), header_bottom: header.bottom, link_left: link.left,
    link_top: Math.round(link.top - box.top), background: style.backgroundColor,
    links: crumbs.querySelectorAll("a").length, text: crumbs.innerText.replace(/\\s+/g, " "),
  };
}"""


def realistic_queue() -> Job:
    """An hour of a small shop's queue: steady work, a burst, a failing report, two hosts
    (one gone), a backlog in the emails queue. Returns a failed job."""
    rng = random.Random(28)
    now = timezone.now()
    tasks = {  # task: (queue, shortest and longest run time in seconds, share)
        "shop.emails.send_receipt": ("emails", 0.15, 0.9, 6),
        "shop.images.make_thumbnails": ("default", 0.8, 4.0, 3),
        "shop.search.reindex_product": ("default", 0.05, 0.4, 4),
        "shop.reports.build_daily_sales": ("reports", 12.0, 48.0, 1),
    }
    names = [task for task, spec in tasks.items() for _ in range(spec[3])]
    finished = []
    for minute in range(60):
        burst = 20 <= minute < 26
        for i in range(4 + (minute * 7) % 9 + (14 if burst else 0)):
            task = rng.choice(names)
            queue, low, high, _ = tasks[task]
            end = now - timedelta(minutes=minute, seconds=rng.uniform(0, 59))
            start = end - timedelta(seconds=rng.uniform(low, high))
            due = start - timedelta(seconds=rng.uniform(0.02, 25 if burst else 1.5))
            failed = task.endswith("sales") and i % 3 == 0
            finished.append(
                Job(
                    task=task,
                    queue=queue,
                    status=S.FAILED if failed else S.DONE,
                    attempts=3 if failed else 1,
                    created_at=due,
                    run_after=due,
                    started_at=start,
                    finished_at=end,
                    last_error='Traceback (most recent call last):\n  File "shop/reports.py", '
                    "line 88, in build_daily_sales\nConnectionError: the warehouse database "
                    "is unreachable (timeout after 10 s)"
                    if failed
                    else "",
                )
            )
    Job.objects.bulk_create(finished)
    Job.objects.bulk_create(
        Job(task="shop.emails.send_receipt", queue="emails", run_after=now - timedelta(minutes=3))
        for _ in range(25)
    )
    running = Job.objects.create(
        task="shop.images.make_thumbnails",
        status=S.CLAIMED,
        owner="web-1:4243:c1",
        owner_date=now,
        started_at=now - timedelta(seconds=2),
        attempts=1,
    )
    WorkerProcess.objects.create(
        name="web-1:4242:a1",
        host="web-1",
        pid=4242,
        role=WorkerProcess.Role.SUPERVISOR,
        queues=["default", "emails"],
        heartbeat_at=now,
        jobs_done=1812,
    )
    for pid, job in ((4243, running.pk), (4244, None)):
        WorkerProcess.objects.create(
            name=f"web-1:{pid}:c1",
            host="web-1",
            pid=pid,
            queues=["default", "emails"],
            role=WorkerProcess.Role.CHILD,
            supervisor="web-1:4242:a1",
            heartbeat_at=now,
            running_job_id=job,
            running_since=now - timedelta(seconds=2) if job else None,
            jobs_done=906,
            jobs_failed=4,
        )
    WorkerProcess.objects.create(
        name="web-2:977:b2",
        host="web-2",
        pid=977,
        role=WorkerProcess.Role.SUPERVISOR,
        queues=["reports"],
        heartbeat_at=now - timedelta(minutes=20),
        jobs_done=310,
        jobs_failed=12,
    )
    return Job.objects.filter(status=S.FAILED).order_by("-finished_at").first()  # type: ignore[return-value]


def assert_laid_out_like_the_admin(
    page: Page, reference: dict[str, Any], trail: tuple[str, ...]
) -> None:
    """No element beyond 1280 px; breadcrumbs as the admin draws its own: the same
    element, the same band right under the header, the same colours and padding."""
    layout = page.evaluate(OVERFLOW_JS)
    assert layout["wide"] == [] and layout["scroll"] <= layout["width"] == WIDTH, (page.url, layout)
    crumbs = page.evaluate(CRUMBS_JS)
    places = [crumbs["text"].find(part) for part in trail]
    assert -1 not in places and places == sorted(places), (trail, crumbs)
    assert abs(crumbs["top"] - crumbs["header_bottom"]) <= 1, "right under the header"
    assert (crumbs["left"], crumbs["width"]) == (0, WIDTH), "the whole band"
    for key in ("tag", "background", "height", "link_left", "link_top"):
        assert crumbs[key] == reference[key], (key, crumbs, reference)


def test_the_apps_pages_fit_1280_px_with_the_admins_breadcrumbs(
    page: Page, live_server: Any, settings: Any
) -> None:
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "SCHEDULE": {"nightly-sales": {"task": task_path(jobs.noop), "cron": "0 3 * * *"}},
    }
    failed = realistic_queue()
    log_in(page, live_server.url)  # lands on the job list: Django's own page
    reference = page.evaluate(CRUMBS_JS)
    assert reference["links"] == 2 and reference["left"] == 0, reference
    admin = f"{live_server.url}/admin/django_dbqueue"
    for url, trail in (
        (f"{admin}/job/dashboard/", ("Home", "Job queue", "Jobs", "Job queue dashboard")),
        (f"{admin}/job/schedules/", ("Home", "Jobs", "Dashboard", "Recurring schedules")),
        (f"{admin}/job/{failed.pk}/change/", ("Home", "Jobs", f"#{failed.pk}")),
        (f"{admin}/workerprocess/", ("Home", "Job queue", "Worker processes")),
        # The job list is Django's page: its columns fit beside the sidebar and filters.
        (f"{admin}/job/", ("Home", "Job queue", "Jobs")),
        (f"{admin}/job/?status__exact=failed", ("Home", "Job queue", "Jobs")),
    ):
        page.goto(url)
        assert_laid_out_like_the_admin(page, reference, trail)
        if "/dashboard/" in url:
            expect(page.locator("#tasks tbody tr")).to_have_count(4)
    # The job page: status, error and buttons before the call; the traceback last.
    page.goto(f"{admin}/job/{failed.pk}/change/")
    order = page.evaluate(
        """() => ["field-status_display", "field-error_summary", "field-last_error_display",
                  "field-args_display"].map(
            c => document.querySelector("." + c).getBoundingClientRect().top)"""
    )
    assert order == sorted(order), order
    buttons = page.get_by_role("button", name="Requeue and run now").bounding_box()
    assert buttons is not None and buttons["y"] < order[0] + 60
    expect(page.locator(".field-last_error_display")).to_contain_text("ConnectionError")
    expect(page.locator("fieldset", has_text="Traceback")).to_have_count(1)
    expect(page.locator(".field-finished_at_time")).to_contain_text(
        failed.finished_at.strftime("%H:%M:%S")  # type: ignore[union-attr]
    )


def test_dashboard_refreshes_itself_once_asked_and_remembers(
    page: Page, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 s: each check below is one round trip, done well before the next reload.
    monkeypatch.setattr(JobAdmin, "dashboard_refresh_seconds", 3)
    state = "() => [window.__marker, localStorage.getItem('django_dbqueue.dashboard.refresh')]"
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/django_dbqueue/job/dashboard/")
    toggle = page.locator("#dbq-refresh")
    expect(toggle).not_to_be_checked()  # off until asked: each refresh costs queries
    page.evaluate("window.__marker = 'first'")
    page.wait_for_timeout(4_500)
    assert page.evaluate(state) == ["first", None], "no refresh while off"

    with page.expect_navigation(timeout=20_000):
        toggle.check()  # the page reloads 3 s later
    assert page.evaluate(state) == [None, "on"], "reloaded, and the choice kept"
    expect(toggle).to_be_checked()  # remembered across the reload
    with page.expect_navigation(timeout=20_000):
        pass  # and it keeps refreshing
    toggle.uncheck()
    page.evaluate("window.__marker = 'kept'")
    page.wait_for_timeout(4_500)
    assert page.evaluate(state) == ["kept", "off"], "no refresh once turned off"


def test_dashboard_renders_with_chart_workers_and_failures(page: Page, live_server: Any) -> None:
    realistic_queue()
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/django_dbqueue/job/")
    page.get_by_role("link", name="Dashboard").click()
    expect(page.locator("h1")).to_have_text("Job queue dashboard")
    assert page.locator("svg.dbq-chart rect").count() >= 60
    expect(page.locator("#workers")).to_contain_text("web-1")
    expect(page.locator("#workers .dbq-dead")).to_have_count(1)
    expect(page.locator("#queues")).to_contain_text("3 min")
    expect(page.locator("#tasks")).to_contain_text("shop.reports.build_daily_sales")
    failures = page.locator("#failures tbody tr")
    expect(failures).to_have_count(10)

    target = ROOT / "docs" / "dashboard.png" if os.environ.get("DBQUEUE_DOCS_SCREENSHOT") else None
    shot = page.screenshot(full_page=True, path=target)
    assert shot.startswith(b"\x89PNG") and len(shot) > 10_000

    first = failures.first.locator("a").first.inner_text()
    failures.first.get_by_role("button", name="Requeue").click()
    expect(page.locator("ul.messagelist")).to_contain_text(f"Job {first} requeued")
    expect(page.locator("#failures")).not_to_contain_text(f"{first}\n")
