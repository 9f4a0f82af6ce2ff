"""The dashboard's confirmation pages in a real browser (headless Chromium) on a real database.

Each confirmation page refuses an action it does not take, naming the ones it does. No
confirmation page reloads itself: a message's, a group's or a live control change's, each
left open past the refresh interval, is still the page the operator opened, while a listing
beside it reloads. Nor does the answer to a confirmed change: reloading it would send the
change again.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from sqlqueue_orm import Transport
from sqlqueue_orm.recoverability.error_queue import ErrorQueue
from sqlqueue_orm.recoverability.groups import FailureGroups
from tests.integration.test_dashboard_browser import By, click, driver  # noqa: F401
from tests.integration.test_failure_groups import fail
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app

#: Seconds between the reloads of the pages that do reload (the default).
REFRESH = 10.0


def _one_failure(database: Any) -> tuple[Transport, ErrorQueue, str, str]:
    """A transport with queues ``error`` and ``inbox`` and one failed message ``m1``: the
    transport, the error queue, the message's row id and its failure group's id."""
    transport = database.transport()
    transport.create_queues(["error", "inbox"])
    fail(transport, "m1")
    errors = ErrorQueue(transport, "error")
    return transport, errors, errors.list()[0].id, FailureGroups(errors).list()[0].id


def test_a_confirmation_page_refuses_an_unknown_action_naming_those_it_takes(database):
    transport, errors, row_id, group = _one_failure(database)
    taken = {
        f"/errors/confirm?action=move&id={row_id}": "retry, delete or retry_all",
        f"/errors/groups/confirm?action=move&group={group}": "retry or delete",
        "/errors/matching?action=move&text=m1": "retry or delete",
        "/control/confirm?endpoint=inbox&action=move": "pause, resume or concurrency",
    }
    with browser.served(create_app(transport, allow_changes=True)) as base:
        answers = {path: httpx.get(base + path) for path in taken}
    for path, accepted in taken.items():
        assert answers[path].status_code == 400, path
        assert f"action &#39;move&#39; must be {accepted}" in answers[path].text, path
    assert len(errors.list()) == 1


def test_no_confirmation_page_reloads_itself(database, driver):  # noqa: F811
    transport, _errors, row_id, group = _one_failure(database)
    app = create_app(transport, allow_changes=True, refresh_interval=REFRESH)
    with browser.served(app) as base:
        pages = {
            # first, so a background tab: shows that a reload there would be seen
            "listing": "/errors/groups",
            "message": f"/errors/confirm?action=delete&id={row_id}",
            "all": "/errors/confirm?action=retry_all",
            "group": f"/errors/groups/confirm?action=retry&group={group}",
            "control": "/control/confirm?endpoint=inbox&action=pause",
            "resize": "/control/confirm?endpoint=inbox&action=concurrency&concurrency=2",
        }
        tabs = {}
        first = driver.current_window_handle
        for name, path in pages.items():
            if tabs:
                driver.switch_to.new_window("tab")
            driver.get(base + path)
            assert driver.find_elements(By.TAG_NAME, "h1"), name
            driver.execute_script("window.sqlqueueOpened = 1;")
            tabs[name] = driver.current_window_handle
        time.sleep(REFRESH + 2)
        kept, offered = {}, {}
        for name, handle in tabs.items():
            driver.switch_to.window(handle)
            kept[name] = driver.execute_script("return window.sqlqueueOpened === 1;")
            offered[name] = bool(driver.find_elements(By.ID, "refresh-toggle"))
        for handle in list(tabs.values()):
            if handle != first:
                driver.switch_to.window(handle)
                driver.close()
        driver.switch_to.window(first)
    assert kept == {name: name != "listing" for name in pages}
    assert offered == {name: name == "listing" for name in pages}  # no pause button either


def test_an_answer_to_a_confirmed_change_never_reloads_itself(database, driver):  # noqa: F811
    transport, errors, _row_id, group = _one_failure(database)
    app = create_app(transport, allow_changes=True, refresh_interval=1)
    posts: list[str] = []

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            posts.append(scope["path"])
        await app(scope, receive, send)

    with browser.served(recorded) as base:
        driver.get(f"{base}/errors/groups/confirm?action=retry&group={group}")
        FailureGroups(errors).delete(group)  # another operator, meanwhile
        click(driver, driver.find_element(By.ID, "confirm"))
        assert group in driver.find_element(By.ID, "problem").text
        time.sleep(4)  # four refresh intervals: a reload would send the form again
        assert posts == ["/errors/groups/retry"]
        assert driver.find_elements(By.ID, "refresh-toggle") == []
