"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real
control plane and worker: it lists a running job, shows its progress growing, and its
buttons and rate-limit input steer the job through the API. Auth is on: the page asks
for a token, and takes one from its address."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from service.db import Database
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.auth import TOKENS
from tests.kit.e2e import create_job, load, running_cluster, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
UI_TIMEOUT_MS = 30_000


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    # rate-limited epochs stay on the driver; no Spark needed
    with running_cluster(db, fresh_db_url, WorkerSettings(spark_mode="never"), name="dash") as c:
        yield c


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make chromium` (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


def progress_value(bar: Locator) -> float:
    return float(bar.evaluate("el => el.value"))


def wait_progress_grows(bar: Locator, what: str) -> None:
    """The bar's value goes above zero, then above that first reading."""
    first = wait_for(lambda: progress_value(bar), timeout=60, what=f"{what} above 0")
    wait_for(lambda: progress_value(bar) > first, timeout=60, what=f"{what} growing")


def job(http: httpx.Client, job_id: int) -> dict:  # type: ignore[type-arg]
    r = http.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_dashboard_shows_and_steers_a_running_job(
    cluster: tuple[httpx.Client, Worker], browser: Browser, db: Database
) -> None:
    http, _ = cluster
    base = str(http.base_url).rstrip("/")
    load(http, 30_000)  # the total is the table's exact count: known at once
    # 2 actors at 500 rows/s each, then 100: a minute or more of backfill, time for every
    # step below even on a slow machine (the last step lifts the limit)
    job_id = create_job(http, "dash_orders", rate_limit=500)

    page: Page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(UI_TIMEOUT_MS)
    page_errors: list[str] = []
    outside: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))

    def only_the_service(route, request) -> None:  # type: ignore[no-untyped-def]
        if urlsplit(request.url).netloc == urlsplit(base).netloc:
            route.continue_()
        else:
            outside.append(request.url)
            route.abort()

    page.route("**/*", only_the_service)

    # without a token the page asks for one; a reader's token shows the jobs
    page.goto(f"{base}/dashboard")
    expect(page.locator("#token-form")).to_be_visible()
    page.get_by_role("textbox", name="Token").fill(TOKENS["reader"])
    page.get_by_role("button", name="Use token").click()
    expect(page.locator("#token-form")).to_be_hidden()
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    expect(row).to_contain_text("dash_orders")
    # an admin's, given in the address, replaces it and leaves the address at once
    page.goto(f"{base}/dashboard#token={TOKENS['admin']}")
    address = lambda: page.evaluate("location.href")  # noqa: E731
    wait_for(lambda: "token" not in address(), timeout=10, what="the token out of the address")

    # the list shows the running job, its progress bar grows
    expect(row).to_contain_text("dash_orders")
    expect(row).to_contain_text("arrangement")
    expect(row).to_contain_text("creating")
    expect(page.get_by_role("status")).to_have_text("live")
    list_bar = page.get_by_role("progressbar", name="Progress of dash_orders")
    wait_progress_grows(list_bar, "list")

    # the poll updates the row in place: a link replaced between a click's press and
    # release would swallow the click
    link = page.get_by_role("link", name="dash_orders")
    link.evaluate("a => { window.linkBeforePoll = a; }")
    before = progress_value(list_bar)
    wait_for(lambda: progress_value(list_bar) > before, timeout=60, what="list polled again")
    assert link.evaluate("a => a === window.linkBeforePoll && a.isConnected")

    # the job view: progress, a heatmap cell per vnode, a sparkline, the details
    page.get_by_role("link", name="dash_orders").click()
    expect(page.get_by_role("heading", name="dash_orders")).to_be_visible()
    wait_progress_grows(page.get_by_role("progressbar", name="Backfill progress"), "job view")
    vnodes = len(http.get(f"/v1/jobs/{job_id}/progress").json()["vnodes"])
    assert vnodes > 0
    expect(page.locator("#heatmap .cell")).to_have_count(vnodes)
    wait_for(
        lambda: page.locator("#sparkline-line").get_attribute("points"),
        timeout=30,
        what="sparkline",
    )
    expect(page.locator("#job-details")).to_contain_text("recoveries")

    # a rate limit set on the page is what the API reports
    rate = page.get_by_label("Rate limit (rows/s per actor)")
    expect(rate).to_have_value("500")
    rate.fill("100")
    page.get_by_role("button", name="Apply").click()
    try:
        wait_for(lambda: job(http, job_id)["rate_limit"] == 100, timeout=60, what="rate limit 100")
    except AssertionError as e:  # once seen in a full run: say what the page showed
        alert = page.get_by_role("alert")
        raise AssertionError(f"{e}; the page's alert: {alert.text_content()!r}") from e
    expect(page.locator("#job-details")).to_contain_text("100 rows/s per actor")

    # an API error is shown, and changes nothing
    rate.fill("-1")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_role("alert")).to_contain_text("rate_limit")
    expect(page.get_by_role("alert")).to_contain_text("validation_error")
    assert job(http, job_id)["rate_limit"] == 100
    page.get_by_role("button", name="Dismiss error").click()
    expect(page.get_by_role("alert")).to_be_hidden()

    # pause and resume; the stored event comes back over the event stream
    with page.expect_response(lambda r: r.url.endswith("/pause")) as paused:
        page.get_by_role("button", name="Pause").click()
    assert paused.value.status == 200, paused.value.text()
    wait_for(lambda: job(http, job_id)["paused"] is True, timeout=30, what="paused")
    expect(page.locator("#job-paused")).to_be_visible()
    expect(page.locator("#job-events")).to_contain_text("paused")
    resume = page.get_by_role("button", name="Resume")
    expect(resume).to_be_enabled()
    with page.expect_response(lambda r: r.url.endswith("/resume")) as resumed:
        resume.click()
    assert resumed.value.status == 200, resumed.value.text()
    wait_for(lambda: job(http, job_id)["paused"] is False, timeout=30, what="resumed")
    expect(page.locator("#job-events")).to_contain_text("resumed")
    expect(page.locator("#job-paused")).to_be_hidden()
    expect(page.get_by_role("button", name="Pause")).to_be_enabled()
    assert job(http, job_id)["state"] == "creating", "the backfill ended too early for this test"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    # no limit: the job finishes and the page follows it to 100%
    rate.fill("")
    expect(rate).to_have_value("")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_role("alert")).to_be_hidden()
    wait_for(lambda: job(http, job_id)["rate_limit"] is None, timeout=30, what="no rate limit")
    wait_for(lambda: job(http, job_id)["state"] == "created", timeout=120, what="job created")
    expect(page.locator("#job-state")).to_have_text("created", timeout=60_000)
    expect(page.locator("#job-percent")).to_have_text("100.00%")
    page.get_by_role("link", name="All jobs").click()
    expect(row).to_contain_text("created")
    listed = page.get_by_role("progressbar", name="Progress of dash_orders")
    wait_for(lambda: progress_value(listed) == 100, timeout=30, what="100% in the list")

    assert page_errors == []
    assert outside == []
    page.close()


def test_dashboard_shows_a_snapshot_jobs_vnodes_its_worker_and_recent_events(
    cluster: tuple[httpx.Client, Worker], browser: Browser
) -> None:
    """A snapshot job (the default kind) reading its snapshot: its vnodes drawn as under
    way (they are consuming, then consumed), the epoch it reads at rather than its own
    phase-1 epochs, the worker its actors run on; the first load asks for recent events
    only."""
    http, worker = cluster
    base = str(http.base_url).rstrip("/")
    load(http, 30_000)
    # 2 actors at 100 rows/s: minutes of reading the snapshot, whatever the machine's load
    job_id = create_job(http, "snap", "snapshot", rate_limit=100)
    snapshot_epoch = job(http, job_id)["snapshot_epoch"]
    page: Page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(UI_TIMEOUT_MS)
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    with page.expect_request(lambda r: "/v1/events" in r.url) as first_stream:
        page.goto(f"{base}/dashboard#token={TOKENS['admin']}")
    assert "recent=" in first_stream.value.url
    workers = page.locator("#workers-body tr")
    expect(workers).to_have_count(1)
    expect(workers.first).to_contain_text("dash")
    expect(workers.first).to_contain_text("alive")
    page.get_by_role("link", name="snap").click()
    expect(page.get_by_role("heading", name="snap")).to_be_visible()
    expect(page.locator("#job-state")).to_have_text("creating · snapshot")
    expect(page.locator("#job-rows")).to_contain_text(
        f"reading the snapshot at epoch {snapshot_epoch}"
    )
    expect(page.locator("#legend-in-progress")).to_have_text("consuming")
    under_way = page.locator('#heatmap .cell.in_progress[data-state="consuming"]')
    wait_for(lambda: under_way.count() > 0, timeout=60, what="vnodes drawn as consuming")
    expect(page.locator("#job-details")).to_contain_text("dash (")
    expect(page.locator("#job-recoveries")).to_contain_text("none")

    # a failure its actor cannot get past (what a worker reports as fatal) fails the job:
    # the page shows the error and a Retry button, which starts it again
    placed = http.get("/v1/workers").json()["workers"][0]["actors"]
    actor = next(a["id"] for a in placed if a["job_id"] == job_id)
    report = {"message": "disk full at vnode 3", "cause_actor_id": actor, "fatal": True}
    r = http.post(
        f"/v1/workers/{worker.client.worker_id}/failures",
        json=report,
        headers={"Authorization": f"Bearer {TOKENS['worker']}"},
    )
    assert r.status_code == 202, r.text
    wait_for(lambda: job(http, job_id)["state"] == "failed", timeout=60, what="failed")
    expect(page.locator("#job-state")).to_have_text("failed", timeout=60_000)
    expect(page.locator("#job-failure")).to_contain_text("disk full at vnode 3")
    with page.expect_response(lambda r: r.url.endswith("/retry")) as retried:
        page.get_by_role("button", name="Retry").click()
    assert retried.value.status == 200, retried.value.text()
    wait_for(lambda: job(http, job_id)["state"] == "creating", timeout=60, what="retried")
    expect(page.get_by_role("button", name="Retry")).to_be_hidden()
    assert page_errors == []
    page.close()
