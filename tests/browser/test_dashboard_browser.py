"""The dashboard in headless Chromium: list the queues, open a dead job and retry it, pause and
resume a queue, cancel a running job, and be refused without credentials. The dashboard is a
real ``sqla-jobs dashboard`` process on a free port, connected as the operator role."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from sqla_jobs import Jobs
from sqla_jobs.db.urls import sqlalchemy_url
from tests.acceptance._processes import REPO, dashboard
from tests.reliability import test_roles as doc
from tests.reliability.test_roles import Roles

from . import _scene

USER, PASSWORD = "ops", "browser-test-password"
DOCS = REPO / "docs"
SCREENSHOTS = os.environ.get("SQLA_JOBS_SCREENSHOTS") == "1"
#: Seconds a page may take to show what an action did.
WAIT = 15

#: The roles and grants of docs/roles.md, made as the page says.
doc_sql = doc.doc_sql
doc_roles = doc.roles


@pytest.fixture(scope="module")
def admin(migrated_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def scene(doc_roles: Roles, admin: Engine) -> tuple[Jobs, _scene.Scene]:
    jobs = _scene.make_jobs(doc_roles.schema)
    return jobs, _scene.build(admin, jobs)


@pytest.fixture(scope="module")
def base_url(
    doc_roles: Roles, scene: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``sqla-jobs dashboard`` as the operator, with credentials, on a free port."""
    log = tmp_path_factory.mktemp("dashboard") / "dashboard.log"
    env = {"SQLA_JOBS_DASHBOARD_USER": USER, "SQLA_JOBS_DASHBOARD_PASSWORD": PASSWORD}
    schema = ("--schema", doc_roles.schema)
    with dashboard(doc_roles.url("operator"), log, *schema, env=env, exit_0=False) as port:
        yield f"http://127.0.0.1:{port}"
    assert PASSWORD not in log.read_text()


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(argument)
    # The browser's console (CSP violations) and its network events (the status of a response).
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    browser.execute_cdp_cmd("Network.enable", {})
    try:
        yield browser
    finally:
        browser.quit()


def authenticate(driver: WebDriver, user: str | None) -> None:
    """Send (or stop sending) HTTP Basic credentials with every request of the browser."""
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


@pytest.fixture
def browser(driver: WebDriver, base_url: str) -> WebDriver:
    """The browser, signed in, on the queues page."""
    authenticate(driver, USER)
    driver.get(f"{base_url}/")
    return driver


#: While a POST's redirect lands, an element found on the page before it belongs to no document
#: any more; Chromium reports it as a stale element or as an inspector error. Either: look again.
REPLACED = (WebDriverException,)


def flash(driver: WebDriver, expected: str) -> str:
    """Wait for the page an action redirected to, and return its flash."""
    WebDriverWait(driver, WAIT, ignored_exceptions=REPLACED).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, "p.flash"), expected)
    )
    found: str = WebDriverWait(driver, WAIT, ignored_exceptions=REPLACED).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "p.flash").text
    )
    return found


def queue_row(driver: WebDriver, queue: str) -> object:
    return driver.find_element(By.XPATH, f"//tr[th/a[normalize-space()='{queue}']]")


def click_in_queue_row(driver: WebDriver, queue: str, button: str) -> None:
    """Click ``button`` (a CSS selector) in ``queue``'s row, found afresh until the click lands."""

    def attempt(d: WebDriver) -> bool:
        queue_row(d, queue).find_element(By.CSS_SELECTOR, button).click()  # type: ignore[attr-defined]
        return True

    WebDriverWait(driver, WAIT, ignored_exceptions=REPLACED).until(attempt)


def queue_row_text(driver: WebDriver, queue: str) -> str:
    found: str = WebDriverWait(driver, WAIT, ignored_exceptions=REPLACED).until(
        lambda d: queue_row(d, queue).text  # type: ignore[attr-defined]
    )
    return found


def screenshot(driver: WebDriver, name: str, height: int) -> None:
    """Save the window, ``height`` pixels tall, as docs/``name`` (with SQLA_JOBS_SCREENSHOTS=1)."""
    if not SCREENSHOTS:
        return
    driver.set_window_size(1280, height)
    try:
        driver.save_screenshot(str(DOCS / name))
    finally:
        driver.set_window_size(1280, 900)


def state(admin: Engine, schema: str, job_id: int) -> tuple[str, bool] | None:
    with admin.connect() as conn:
        row = conn.execute(
            text(
                f"SELECT state, cancel_requested_at IS NOT NULL FROM {schema}.sqla_jobs_job"
                " WHERE id = :id"
            ),
            {"id": job_id},
        ).first()
    return None if row is None else (row[0], row[1])


def test_lists_the_queues_with_their_depth_and_pause(browser: WebDriver) -> None:
    assert browser.title == "Queues · sqla-jobs", browser.find_element(By.TAG_NAME, "main").text
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.grid tbody th a")]
    assert {"mail", "reports", "webhooks"} <= set(names)
    assert "since" in queue_row(browser, "webhooks").text  # type: ignore[attr-defined]
    screenshot(browser, "dashboard-queues.png", 640)


def test_opens_a_dead_job_and_retries_it(
    browser: WebDriver, base_url: str, scene: tuple[Jobs, _scene.Scene], admin: Engine
) -> None:
    jobs, made = scene
    job_id = made.dead[0]
    browser.find_element(By.LINK_TEXT, "Dead").click()
    WebDriverWait(browser, WAIT).until(ec.title_is("Dead jobs · sqla-jobs"))
    browser.find_element(By.LINK_TEXT, str(job_id)).click()
    WebDriverWait(browser, WAIT).until(ec.title_is(f"Job {job_id} · sqla-jobs"))
    page = browser.find_element(By.TAG_NAME, "main").text
    assert "SMTPServerDisconnected: Connection unexpectedly closed" in page
    assert "invoice_id" not in page, "no payload unless --show-payload"
    screenshot(browser, "dashboard-job.png", 900)
    browser.find_element(By.CSS_SELECTOR, "button.action-retry").click()
    assert flash(browser, "retried") == f"retried 1 job: {job_id}"
    assert state(admin, str(jobs.schema), job_id) == ("pending", False)


def test_pauses_and_resumes_a_queue(browser: WebDriver) -> None:
    click_in_queue_row(browser, "mail", "button.action-pause")
    assert flash(browser, "paused").startswith("paused queue mail")
    assert "since" in queue_row_text(browser, "mail")
    click_in_queue_row(browser, "mail", "button.action-resume")
    assert flash(browser, "resumed") == "resumed queue mail"
    assert queue_row(browser, "mail").find_elements(By.CSS_SELECTOR, "button.action-pause")  # type: ignore[attr-defined]


def test_cancels_a_running_job(
    browser: WebDriver, scene: tuple[Jobs, _scene.Scene], admin: Engine
) -> None:
    jobs, made = scene
    job_id = made.running[0]
    browser.find_element(By.LINK_TEXT, "Running").click()
    WebDriverWait(browser, WAIT).until(ec.title_is("Running jobs · sqla-jobs"))
    row = browser.find_element(By.XPATH, f"//tr[td/a[normalize-space()='{job_id}']]")
    row.find_element(By.CSS_SELECTOR, "button.action-cancel").click()
    said = flash(browser, "asked the workers")
    assert said.startswith(f"asked the workers to stop 1 running job: {job_id}")
    row = browser.find_element(By.XPATH, f"//tr[td/a[normalize-space()='{job_id}']]")
    assert "cancel requested" in row.text
    assert state(admin, str(jobs.schema), job_id) == ("running", True)


def test_the_throughput_chart_is_drawn_by_the_app_itself(browser: WebDriver) -> None:
    browser.find_element(By.LINK_TEXT, "Throughput").click()
    WebDriverWait(browser, WAIT).until(ec.title_is("Throughput · sqla-jobs"))
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) == 2
    assert charts[0].find_elements(By.CSS_SELECTOR, "rect.s-completed")
    console = [e["message"] for e in browser.get_log("browser")]
    assert not [m for m in console if "Content Security Policy" in m], console
    screenshot(browser, "dashboard-throughput.png", 1040)


def statuses(driver: WebDriver, url: str) -> list[int]:
    """The statuses of the responses to ``url`` since the browser's network log was last read."""
    found = []
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        if event["method"] == "Network.responseReceived":
            response = event["params"]["response"]
            if response["url"] == url:
                found.append(int(response["status"]))
    return found


def test_an_unauthenticated_request_is_refused(driver: WebDriver, base_url: str) -> None:
    authenticate(driver, None)
    driver.get_log("performance")  # what came before
    driver.get(f"{base_url}/jobs")
    assert statuses(driver, f"{base_url}/jobs") == [401]
    assert not driver.find_elements(By.TAG_NAME, "nav"), "no page of the dashboard"
    authenticate(driver, USER)
    driver.get(f"{base_url}/jobs")
    assert statuses(driver, f"{base_url}/jobs") == [200]


def test_screenshots_stay_small() -> None:
    if not SCREENSHOTS:
        pytest.skip("screenshots are written only with SQLA_JOBS_SCREENSHOTS=1")
    for name in ("dashboard-queues.png", "dashboard-job.png", "dashboard-throughput.png"):
        path = Path(DOCS / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size < 300_000, name


@pytest.fixture
def rebinding_driver() -> Iterator[WebDriver]:
    """A browser in which ``rebound.example`` resolves to 127.0.0.1, as it would for a page
    whose DNS name an attacker rebinds."""
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--host-resolver-rules=MAP rebound.example 127.0.0.1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    browser.execute_cdp_cmd("Network.enable", {})
    try:
        yield browser
    finally:
        browser.quit()


def test_a_page_rebound_to_this_machine_reads_nothing_and_changes_nothing(
    rebinding_driver: WebDriver, base_url: str, admin: Engine, scene: tuple[Jobs, _scene.Scene]
) -> None:
    jobs, _ = scene
    driver = rebinding_driver
    authenticate(driver, USER)  # even a browser that holds the credentials
    rebound = base_url.replace("127.0.0.1", "rebound.example")
    driver.get(f"{rebound}/")
    assert statuses(driver, f"{rebound}/") == [400]
    assert "does not answer to that name" in driver.find_element(By.TAG_NAME, "body").text
    # The rebound page's own script: same origin to the browser, so it may POST and read.
    status = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch("/queues/mail/pause", {method: "POST", body: new URLSearchParams({next: "/"}),
                                     redirect: "manual"})
            .then(r => done(r.status), e => done(String(e)));
        """
    )
    assert status == 400
    with admin.connect() as conn:
        paused = conn.execute(
            text(f"SELECT paused_at FROM {jobs.schema}.sqla_jobs_queue WHERE queue = 'mail'")
        ).scalar()
    assert paused is None
    driver.get(f"{base_url}/")
    assert statuses(driver, f"{base_url}/") == [200], "the dashboard's own name still answers"
