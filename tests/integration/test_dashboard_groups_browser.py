"""The dashboard's failure groups and search in a real browser (Chromium) on a real database.

The groups page lists the groups; a group retry, confirmed, sends exactly that group's messages
back, once; the errors page finds a message by id, header and body text, pages to the last row,
and retries "all that match" exactly. A group POST without the CSRF token is refused.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.test_dashboard_browser import By, click, driver, error_ids  # noqa: F401
from tests.integration.test_failure_groups import fail
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app


def listed(driver: Any) -> list[str]:  # noqa: F811
    return [row.get_attribute("data-message-id")
            for row in driver.find_elements(By.CSS_SELECTOR, "#failed tr[data-id]")]


def search(driver: Any, **fields: str) -> None:  # noqa: F811
    for name, value in fields.items():
        box = driver.find_element(By.ID, name)
        box.clear()
        box.send_keys(value)
    click(driver, driver.find_element(By.ID, "filter"))


def test_groups_page_lists_groups_and_a_group_retry_sends_each_back_once(database, driver):  # noqa: F811
    transport = database.transport()
    transport.create_queues(["error", "inbox", "other"])
    for number in range(3):
        fail(transport, f"v{number}", text=f"order {number}", line=number)
    fail(transport, "k0", kind="builtins.KeyError", endpoint="other")
    fail(transport, "k1", kind="builtins.KeyError", endpoint="other")
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        driver.get(base + "/errors")
        click(driver, driver.find_element(By.ID, "groups-link"))
        groups = driver.find_elements(By.CSS_SELECTOR, "#groups tr[data-group]")
        assert [(g.get_attribute("data-count"), g.find_element(By.CLASS_NAME, "label").text)
                for g in groups] == [("3", "builtins.ValueError: at orders.py:process"),
                                     ("2", "builtins.KeyError: at orders.py:process")]
        value_group = groups[0].get_attribute("data-group")

        click(driver, groups[0].find_element(By.CSS_SELECTOR, ".label a"))  # its messages
        assert listed(driver) == ["v0", "v1", "v2"]

        driver.get(base + "/errors/groups")
        click(driver, driver.find_element(
            By.CSS_SELECTOR, f'tr[data-group="{value_group}"] .retry-group'))
        assert "3 message(s)" in driver.find_element(By.ID, "question").text
        assert error_ids(transport) == {"v0", "v1", "v2", "k0", "k1"}  # asking changed nothing
        page = httpx.get(driver.current_url)  # a POST without its token is refused
        assert httpx.post(base + "/errors/groups/retry", cookies=dict(page.cookies),
                          data={"group": value_group, "confirmed": "yes"},
                          headers={"Origin": base}).status_code == 403
        click(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.ID, "notice").text == (
            f"retried 3 message(s) of group {value_group}")
        groups = driver.find_elements(By.CSS_SELECTOR, "#groups tr[data-group]")
        assert [g.get_attribute("data-count") for g in groups] == ["2"]

        driver.get(base + "/errors/groups?by=endpoint")
        labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#groups .label")]
        assert labels == ["other"]
    assert sorted(m.message_id for m in transport.receive("inbox", 10)) == ["v0", "v1", "v2"]
    assert transport.peek("inbox") == 0
    assert error_ids(transport) == {"k0", "k1"}


def test_search_by_id_header_and_text_pages_to_the_last_row(database, driver):  # noqa: F811
    transport = database.transport()
    transport.create_queues(["error", "inbox"])
    for number in range(12):
        fail(transport, f"m{number}", body=f"order {number} of ACME".encode(),
             custom=f"tenant-{number % 3}")
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        driver.get(base + "/errors")
        search(driver, message_id="m7")
        assert listed(driver) == ["m7"]
        search(driver, message_id="", header="Custom=tenant-1")
        assert listed(driver) == ["m1", "m4", "m7", "m10"]
        search(driver, header="", text="order 11 ")
        assert listed(driver) == ["m11"]

        driver.get(base + "/errors?limit=5")
        seen = listed(driver)
        while driver.find_elements(By.ID, "next-page"):
            click(driver, driver.find_element(By.ID, "next-page"))
            seen += listed(driver)
        assert seen == [f"m{n}" for n in range(12)]  # the last row reached, none twice
        assert driver.find_elements(By.ID, "first-page")

        driver.get(base + "/errors?header=Custom%3Dtenant-2")
        click(driver, driver.find_element(By.ID, "retry-matching"))
        assert "Retry these 4 message(s)" in driver.find_element(By.ID, "question").text
        click(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.ID, "notice").text == "retried 4 message(s)"
    assert sorted(m.message_id for m in transport.receive("inbox", 10)) == [
        "m11", "m2", "m5", "m8"]
    assert len(error_ids(transport)) == 8
