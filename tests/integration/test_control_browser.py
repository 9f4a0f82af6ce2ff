"""The control page in a real browser (Debian's headless Chromium) across two endpoint processes.

An operator opens ``/control``, pauses the endpoint (confirming on its own page), and both
endpoint processes (tests/endpoint_app.py) say they paused; messages sent meanwhile wait; the
resume starts both again and every message is handled once. The action log on the page names
both actions, with this host's user and the browser's address. A read-only dashboard offers no
forms and refuses the change; a POST without the CSRF token or from another origin is refused;
a concurrency of 0 is a 400 naming it.
"""

from __future__ import annotations

import collections
import time

import httpx
import pytest

from sqlqueue_orm import control, health
from sqlqueue_orm.receiving import control as receiving_control
from tests.endpoint_app import UserBase, send_jobs
from tests.integration.test_control_cli import EndpointProcess, _handled, _wait_handled
from tests.integration.test_dashboard_browser import By, click, driver, wait_for  # noqa: F401
from tests.integration.test_dashboard_figures_browser import beat_for_two_minutes
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app


def _row(web: object, endpoint: str) -> object:
    return web.find_element(By.CSS_SELECTOR, f'#endpoints tr[data-endpoint="{endpoint}"]')  # type: ignore[attr-defined]


def test_pause_and_resume_from_the_dashboard_across_two_processes(database, driver):  # noqa: F811
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    transport.create_queue("error")
    processes = [EndpointProcess(database.url, "jobs") for _ in range(2)]
    app = create_app(transport, allow_changes=True)
    try:
        for each in processes:
            each.wait_for("started")
        wait_for(lambda: len([instance for instance in health.read_endpoints(database.engine)
                              if instance.state == health.RUNNING]) == 2)  # both beat
        with browser.served(app) as base:
            driver.get(base + "/control")
            row = _row(driver, "jobs")
            assert row.find_element(By.CSS_SELECTOR, ".state").text == "running"  # type: ignore[attr-defined]
            click(driver, row.find_element(By.CSS_SELECTOR, "button.pause"))  # type: ignore[attr-defined]
            assert "Pause endpoint jobs?" in driver.find_element(By.ID, "question").text
            assert control.state(transport, "jobs") is None  # asking changed nothing
            click(driver, driver.find_element(By.ID, "confirm"))
            assert driver.find_element(By.ID, "notice").text == "paused jobs"
            assert _row(driver, "jobs").find_element(By.CSS_SELECTOR, ".state").text == "paused"  # type: ignore[attr-defined]
            for each in processes:
                each.wait_for("queue jobs: paused")
            waiting = send_jobs(transport, "jobs", 6)
            time.sleep(3 * receiving_control.POLL_INTERVAL)  # both paused: nothing is taken
            assert _handled(database.url) == []
            assert transport.peek("jobs") == 6

            click(driver, _row(driver, "jobs").find_element(By.CSS_SELECTOR, "button.resume"))  # type: ignore[attr-defined]
            click(driver, driver.find_element(By.ID, "confirm"))
            assert driver.find_element(By.ID, "notice").text == "resumed jobs"
            for each in processes:
                each.wait_for("queue jobs: resumed")
            handled = _wait_handled(database.url, 6)
            driver.get(base + "/control")
            actions = driver.find_elements(By.CSS_SELECTOR, "#actions tr[data-id]")
            assert [a.find_element(By.CSS_SELECTOR, ".action").text for a in actions] == [
                "resume",
                "pause",
            ]
            who = actions[0].find_element(By.CSS_SELECTOR, ".who").text
            assert "@" in who and " from 127.0.0.1:" in who
    finally:
        errors = [each.stop() for each in processes]
    assert all(each.process.returncode == 0 for each in processes), errors
    assert collections.Counter(handled) == collections.Counter(waiting)


def test_read_only_cross_site_and_bad_input_change_nothing(database):
    transport = database.transport()
    transport.create_queue("jobs")
    beat_for_two_minutes(transport, "jobs")  # an endpoint: it ran
    with browser.served(create_app(transport)) as base:
        page = httpx.get(base + "/control")
        assert page.status_code == 200 and 'data-endpoint="jobs"' in page.text
        assert "/control/confirm" not in page.text
        asked = httpx.get(base + "/control/confirm", params={"endpoint": "jobs", "action": "pause"})
        assert asked.status_code == 403
        posted = httpx.post(
            base + "/control/change",
            data={"endpoint": "jobs", "action": "pause", "confirmed": "yes"},
        )
        assert posted.status_code == 403
    with browser.served(create_app(transport, allow_changes=True)) as base:
        own = {"origin": base}
        fields = {"endpoint": "jobs", "action": "pause", "confirmed": "yes"}
        without_token = httpx.post(base + "/control/change", data=fields, headers=own)
        assert without_token.status_code == 403 and "CSRF" in without_token.text
        page = httpx.get(base + "/control")
        cookie = page.cookies["sqlqueue_dashboard_csrf"]
        asked = httpx.get(
            base + "/control/confirm",
            params={"endpoint": "jobs", "action": "pause"},
            cookies={"sqlqueue_dashboard_csrf": cookie},
        )
        token = asked.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        elsewhere = httpx.post(
            base + "/control/change",
            data={**fields, "csrf_token": token},
            headers={"origin": "http://evil.example"},
            cookies={"sqlqueue_dashboard_csrf": cookie},
        )
        assert elsewhere.status_code == 403 and "another origin" in elsewhere.text
        bad = httpx.get(
            base + "/control/confirm",
            params={"endpoint": "jobs", "action": "concurrency", "concurrency": "0"},
        )
        assert bad.status_code == 400 and "concurrency &#39;0&#39;" in bad.text
    assert control.state(transport, "jobs") is None
