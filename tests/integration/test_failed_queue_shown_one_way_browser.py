"""The queue a message failed in, shown one way in a real browser (headless Chromium).

A failure as a .NET endpoint writes it (``NServiceBus.FailedQ`` holding ``"public"."billing"``
on PostgreSQL) is shown ``billing`` on every dashboard page an operator reaches it by: the
error-queue list, the message's page, its retry confirmation, and the failure groups' listing of
the group's messages. Only the message's header table keeps the header as stored.
"""

from __future__ import annotations

from typing import Any

import pytest

from sqlqueue_orm import headers
from sqlqueue_orm.recoverability import ErrorQueue
from tests.integration.test_dashboard_browser import By, click, driver  # noqa: F401
from tests.integration.test_failure_groups import fail_dotnet
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app


def shown_failed_queue(driver: Any, message_id: str) -> str:  # noqa: F811
    """The "failed queue" cell of *message_id*'s row in the errors listing."""
    titles = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#failed tr th")]
    row = driver.find_element(By.CSS_SELECTOR, f'#failed tr[data-message-id="{message_id}"]')
    return str(row.find_elements(By.TAG_NAME, "td")[titles.index("failed queue")].text)


def visible_text_but_headers(driver: Any) -> str:  # noqa: F811
    """The page's visible text less the message's header table (which shows them as stored)."""
    return str(driver.execute_script(
        "const page = document.body.cloneNode(true);"
        "page.querySelectorAll('#headers, #raw-headers').forEach(e => e.remove());"
        "return page.innerText;"))


def test_every_page_shows_a_dotnet_failed_queue_by_its_short_name(database, driver):  # noqa: F811
    transport = database.transport()
    transport.create_queues(["error", "billing"])
    fail_dotnet(transport, "order-7", order=7, line=42)
    stored = transport.address_text("billing")  # "public"."billing" on PostgreSQL
    [failed] = ErrorQueue(transport).list()
    assert failed.failed_queue == stored
    if database.dialect == "postgresql":
        assert stored == '"public"."billing"'

    def one_spelling() -> None:
        if stored != "billing":
            assert stored not in visible_text_but_headers(driver), driver.current_url

    app = create_app(transport, allow_changes=True)
    try:
        with browser.served(app) as base:
            driver.get(base + "/errors")
            assert shown_failed_queue(driver, "order-7") == "billing"
            one_spelling()

            click(driver, driver.find_element(By.LINK_TEXT, "order-7"))  # the message's page
            failure = driver.find_element(By.ID, "failure")
            assert failure.find_element(
                By.XPATH, './/tr[th="failed queue"]/td').text == "billing"
            assert driver.find_element(
                By.XPATH, f'//table[@id="headers"]//tr[th="{headers.FAILED_QUEUE}"]/td'
            ).text == stored
            one_spelling()

            click(driver, driver.find_element(By.ID, "retry-one"))  # its confirmation
            [chosen] = driver.find_elements(By.CSS_SELECTOR, "#chosen-list li")
            assert chosen.text == "order-7 — billing: System.InvalidOperationException"
            one_spelling()

            driver.get(base + "/errors/groups")  # the failure groups, then the group's messages
            one_spelling()
            [group] = driver.find_elements(By.CSS_SELECTOR, "#groups tr[data-group]")
            click(driver, group.find_element(By.CSS_SELECTOR, ".label a"))
            assert "group=" in driver.current_url
            assert shown_failed_queue(driver, "order-7") == "billing"
            one_spelling()
    finally:
        app.state.dashboard.close()
    assert [m.message_id for m in ErrorQueue(transport).list()] == ["order-7"]  # nothing moved
