"""The endpoints page and the queue metrics in a real browser (headless Chromium), with a real
endpoint process: running, then stale once it is killed; the queue page shows its samples;
every page but a confirmation reloads itself, and the operator can pause that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sqlqueue_orm import OutgoingMessage, health
from tests.conftest import only
from tests.endpoint_app import Job
from tests.integration.test_endpoint_health import eventually
from testsupport.outbox_app import REPO

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from selenium.webdriver.common.by import By

from sqlqueue_orm.contrib.dashboard import create_app
from testsupport import browser


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    missing = browser.missing_browser()
    if missing:
        pytest.skip(f"no browser: {missing}")
    chromium = browser.chromium()
    try:
        yield chromium
    finally:
        chromium.quit()


def shown(read: Callable[[], Any], done: Callable[[Any], bool], what: str) -> Any:
    """Wait (the page reloads itself) until *read* of the page satisfies *done*."""
    deadline = time.monotonic() + 60
    while True:
        try:
            value = read()
        except Exception as error:  # mid-reload: the element went away
            value = error
        if not isinstance(value, Exception) and done(value):
            return value
        assert time.monotonic() < deadline, f"{what}: last read {value!r}"
        time.sleep(0.1)


@only("sqlite", "postgresql")
def test_endpoints_page_shows_running_then_stale_and_the_queue_page_its_metrics(database, driver):
    transport = database.transport()
    transport.create_queue("error")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.health_app", database.url, "shipping"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    app = create_app(transport, sample_interval=0.5, refresh_interval=1, allow_changes=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started", process.stderr.read()
        transport.send_many("shipping", [OutgoingMessage(Job(number=n)) for n in range(3)])
        eventually(
            lambda: health.read_queue_metrics(database.engine, ["shipping"])["shipping"].samples,
            lambda samples: sum(sample.processed for sample in samples) == 3,
            "the samples of three processed messages",
        )
        with browser.served(app) as base:
            driver.get(base + "/endpoints")
            row = 'tr[data-endpoint="shipping"]'
            state = shown(
                lambda: driver.find_element(By.CSS_SELECTOR, f"{row} .state").text,
                lambda text: text == "running",
                "running",
            )
            assert state == "running"
            assert driver.find_element(By.LINK_TEXT, "Endpoints").get_attribute("class") == "here"
            assert f":{process.pid}" in driver.find_element(By.CSS_SELECTOR, row).text

            # the page reloads itself: a mark left in this page's script state goes away
            driver.execute_script("window.sqlqueueMark = 1;")
            shown(
                lambda: driver.execute_script("return window.sqlqueueMark === undefined;"),
                bool,
                "a reload",
            )

            os.kill(process.pid, signal.SIGKILL)
            process.wait(30)
            stale = shown(
                lambda: driver.find_element(By.CSS_SELECTOR, f"{row} .state").text,
                lambda text: text.startswith("stale for "),
                "stale after the kill (seen through the page's own reloads)",
            )
            assert stale.endswith(" s")

            # pausing stops the reloads: the mark stays (and the button says so)
            toggle = driver.find_element(By.ID, "refresh-toggle")
            toggle.click()
            assert toggle.get_attribute("aria-pressed") == "true"
            assert driver.find_element(By.ID, "refresh-status").text == "auto-refresh paused"
            driver.execute_script("window.sqlqueueMark = 1;")
            driver.get(base + "/queue?name=shipping")  # the pause lasts for the tab
            assert driver.find_element(By.ID, "refresh-toggle").text == "Resume auto-refresh"

            totals = driver.find_element(By.CSS_SELECTOR, "#metrics-latest .totals").text
            assert totals == "3, 0"
            assert driver.find_element(By.CSS_SELECTOR, "#metrics-latest .depth").text == "0"
            charts = driver.find_elements(By.CSS_SELECTOR, "#metrics figure.metric svg")
            assert len(charts) == 4
            driver.find_element(By.ID, "refresh-toggle").click()  # resume

            # a confirmation form never reloads itself
            driver.get(base + "/errors/confirm?action=retry_all")
            assert driver.find_elements(By.ID, "refresh-toggle") == []
            assert "location.reload" not in driver.page_source
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
