"""The dashboard in a real browser: Debian's chromium driven by Selenium through
chromedriver, on SQLite and PostgreSQL. Outside CI a missing browser skips with the
command that installs it; in CI (CI=true) it is a failure.

HOMING_SCREENSHOTS=docs/img makes the test save screenshots of the main pages there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import homing
from homing.cli import cli
from homing.dashboard.server import BackgroundDashboard
from tests.conftest import in_ci

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver"


def _ensure_browser() -> None:
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    if shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(INSTALL.split(), check=False, capture_output=True, timeout=600)
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        message = f"no chromium/chromedriver: install them with `{INSTALL}`"
        if in_ci():
            pytest.fail("CI: " + message)
        pytest.skip(message)  # outside CI only, with the command that installs them


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _ensure_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="homing-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _engine(url: str) -> None:
    for args in (
        ("create", "orders", "--dead-letter", "$dead"),
        ("create", "billing"),
        ("bind", "orders", "to-billing", "--to", "billing", "--credits", "5"),
        ("bind", "billing", "printer", "--consumer", "p-1", "--credits", "2"),
        ("publish", "orders", '{"n": 1}'),
    ):
        result = CliRunner().invoke(cli, ["--db", url, "queues", *args])
        assert result.exit_code == 0, result.output


def _shot(driver: Any, name: str) -> None:
    target = os.environ.get("HOMING_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(target) / f"dashboard-{name}.png"))


def test_dashboard_in_chromium(browser: Any, store_url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    _engine(store_url)
    with homing.connect(store_url) as db:
        db.insert_many([("FiredEvent", {"event": i}) for i in range(3)])
        db.insert_many([("ProcessNotification", {"user": i, "channel": "email"}) for i in range(5)])
        failed = db.insert("ProcessNotification", {"user": 99, "channel": "webhook"})
        job = db.grab(["ProcessNotification"], lock_for=30, where={"user": 99})
        assert job is not None
        db.perm_fail(job, "webhook answered 410")
        dash = BackgroundDashboard(db).start()
        try:
            browser.get(dash.url)
            rows = browser.find_elements(By.CSS_SELECTOR, "#types tbody tr[data-type]")
            assert {r.get_attribute("data-type") for r in rows} == {
                "FiredEvent",
                "ProcessNotification",
            }
            _shot(browser, "overview")

            browser.get(dash.url + "engine")
            nodes = browser.find_elements(By.CSS_SELECTOR, "#graph g.node")
            keys = {n.get_attribute("data-key") for n in nodes}
            assert {"orders", "billing", "$dead"} <= keys
            _shot(browser, "engine")

            for path, title in (
                ("http", "Reliable HTTP"),
                ("sessions", "Client sessions"),
                ("messenger", "Messenger (durable mode)"),
            ):
                browser.get(dash.url + path)
                assert browser.find_element(By.TAG_NAME, "h1").text == title

            browser.get(dash.url + "jobs")
            browser.find_element(By.ID, "f-state").send_keys("failed")
            browser.find_element(By.ID, "f-where").send_keys('{"channel": "webhook"}')
            browser.find_element(By.ID, "f-go").click()
            wait.until(ec.url_contains("state=failed"))
            links = browser.find_elements(By.CSS_SELECTOR, "#jobs a.job-link")
            assert len(links) == 1
            _shot(browser, "jobs")
            links[0].click()
            wait.until(ec.presence_of_element_located((By.ID, "redrive")))
            assert "webhook answered 410" in browser.find_element(By.ID, "failures").text
            _shot(browser, "job")
            browser.find_element(By.ID, "redrive").click()
            wait.until(ec.presence_of_element_located((By.ID, "msg")))
            assert browser.find_element(By.ID, "job-state").text == "ready"
            assert db.details(failed).state == "ready"

            # A POST from this page's origin without the token is refused.
            status = browser.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch(arguments[0], {method: 'POST', credentials: 'same-origin'})"
                ".then(r => done(r.status));",
                dash.url + f"jobs/{failed}/delete",
            )
            assert status == 403
            assert db.details(failed).state == "ready"
        finally:
            dash.stop()
