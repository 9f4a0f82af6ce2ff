"""The dashboard in a real browser (Debian's headless Chromium) on a real database.

Failed messages are made by an Endpoint whose handler raises; the tests click through the pages
as an operator would: the pages render, a retry sends the message back and it is processed, a
delete removes exactly the chosen messages, a POST without the CSRF token is refused.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext
from sqlqueue_orm.recoverability.error_queue import ErrorQueue
from sqlqueue_orm.sending.outbox import Outbox, OutboxOperation
from tests.integration.test_endpoint_transaction_modes import run_until
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app

By: Any
try:
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the dev extra installs it
    By = StaleElementReferenceException = WebDriverException = None

_MISSING = browser.missing_browser() or (None if By else "selenium is not installed")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if _MISSING:
        pytest.skip(f"no browser: {_MISSING}")
    chromium = browser.chromium()
    try:
        yield chromium
    finally:
        chromium.quit()


class Boom(Exception):
    """The failure of the test handlers."""


def fail(transport: Transport, endpoint_name: str, bodies: list[bytes],
         error: type[Exception] = Boom) -> list[str]:
    """Send *bodies* to *endpoint_name*, whose handler raises *error*; wait for the error queue."""
    transport.create_queue(endpoint_name)
    transport.create_queue("error")
    ids = [transport.send(endpoint_name, OutgoingMessage(body)) for body in bodies]
    endpoint = Endpoint(endpoint_name, transport, settings=EndpointSettings(
        concurrency=1, peek_delay=0.1, immediate_retries=0, delayed_retries=0))

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        raise error(f"cannot handle {body!r}")

    run_until(endpoint, lambda: endpoint.stats.failed == len(bodies))
    return ids


def rows(driver: Any) -> dict[str, Any]:
    """The failed messages listed on the errors page, by message id."""
    return {row.get_attribute("data-message-id"): row
            for row in driver.find_elements(By.CSS_SELECTOR, "#failed tr[data-id]")}


def click(driver: Any, element: Any) -> None:
    """Click *element* and wait until the browser has loaded the page it leads to."""
    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    deadline = time.monotonic() + 15
    while True:
        try:
            page.is_enabled()  # raises once the old page is gone
        except StaleElementReferenceException:
            break
        except WebDriverException as error:
            # chromedriver's other word for the same thing, caught mid-navigation
            if "does not belong to the document" not in str(error):
                raise
            break
        assert time.monotonic() < deadline, "the click led to no new page"
        time.sleep(0.02)
    while driver.execute_script("return document.readyState") != "complete":
        assert time.monotonic() < deadline, "the page did not finish loading"
        time.sleep(0.02)


def error_ids(transport: Transport) -> set[str]:
    return {message.message_id for message in transport.browse("error", 100)}


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_pages_render_read_only(database, driver):
    transport = database.transport()
    transport.create_queue("orders")
    failed = fail(transport, "billing", [b"\x00\xffnot text", b'{"order": 1}'])
    for n in range(3):
        transport.send("orders", OutgoingMessage(f"order {n}".encode()))
    outbox = Outbox(transport)
    outbox.create_table()
    with transport.engine.begin() as connection:
        outbox.store(connection, "record-1", [OutboxOperation.from_prepared(
            "orders", OutgoingMessage(b"later").prepare())])
    transport.create_delayed_table("orders")
    later = transport.send("orders", OutgoingMessage(b"later"), delay=3600)
    soon = transport.send("orders", OutgoingMessage(b"soon"), delay=600)
    app = create_app(transport, sample_interval=0.2)
    with browser.served(app) as base:
        driver.get(base + "/")
        assert driver.find_element(By.ID, "mode").text == "read-only"
        depth = driver.find_element(By.CSS_SELECTOR, 'tr[data-queue="orders"] .depth')
        assert depth.text == "3"
        assert driver.find_element(By.CSS_SELECTOR, 'tr[data-queue="error"] .depth').text == "2"
        assert driver.find_elements(By.CSS_SELECTOR, 'tr[data-queue="orders"] svg polyline')

        click(driver, driver.find_element(By.LINK_TEXT, "orders"))
        assert len(driver.find_elements(By.CSS_SELECTOR, "#messages tr")) == 4  # header + 3
        click(driver, driver.find_element(By.CSS_SELECTOR, "#messages a"))
        assert driver.find_element(By.ID, "body").text == "order 0"
        click(driver, driver.find_element(By.ID, "as-hex"))
        assert driver.find_element(By.ID, "body").text.startswith(
            "00000000  6f 72 64 65 72 20 30")

        click(driver, driver.find_element(By.LINK_TEXT, "Errors"))
        listed = rows(driver)
        assert set(listed) == set(failed)
        row_id = listed[failed[0]].get_attribute("data-id")
        assert not driver.find_elements(By.CSS_SELECTOR, "#failed input[type=checkbox]")
        assert not driver.find_elements(By.ID, "retry-chosen")
        assert "Boom" in listed[failed[0]].text
        click(driver, listed[failed[0]].find_element(By.TAG_NAME, "a"))
        headers = driver.find_element(By.ID, "headers").text
        assert "NServiceBus.FailedQ" in headers and "billing" in headers
        assert "billing" in driver.find_element(By.ID, "failure").text
        body = driver.find_element(By.ID, "body").text  # not UTF-8: shown as hex only
        assert body.startswith("00000000  00 ff 6e 6f 74")
        assert not driver.find_elements(By.ID, "retry-one")

        click(driver, driver.find_element(By.LINK_TEXT, "Outbox"))
        assert driver.find_element(By.ID, "pending").text == "1"
        assert driver.find_element(By.ID, "oldest").text == "record-1"
        click(driver, driver.find_element(By.LINK_TEXT, "Delayed"))
        delayed = driver.find_elements(By.CSS_SELECTOR, "#delayed tr[data-message-id]")
        assert [row.get_attribute("data-message-id") for row in delayed] == [soon, later]
        assert "orders" in delayed[0].find_element(By.CLASS_NAME, "destination").text
        driver.get(base + "/delayed?endpoint=nobody")
        assert "nobody" in driver.find_element(By.ID, "problem").text

        # Read-only: the confirmation page and the POSTs refuse, nothing changes.
        driver.get(f"{base}/errors/confirm?action=delete&id={row_id}")
        assert "read-only" in driver.find_element(By.ID, "problem").text
        answer = httpx.post(base + "/errors/delete", data={"id": row_id, "confirmed": "yes"},
                            headers={"Origin": base})
        assert answer.status_code == 403
    assert error_ids(transport) == set(failed)


def test_errors_filter_by_exception_type_endpoint_and_time(database, driver):
    transport = database.transport()
    boom = fail(transport, "billing", [b"a", b"b"], Boom)
    other = fail(transport, "shipping", [b"c"], KeyError)
    app = create_app(transport)
    with browser.served(app) as base:
        driver.get(base + "/errors")
        assert set(rows(driver)) == set(boom + other)
        driver.find_element(By.CSS_SELECTOR, "#exception_type option[value='']")
        types = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#exception_type option")]
        assert "builtins.KeyError" in types
        driver.find_element(By.XPATH, "//select[@id='exception_type']/option[text()="
                            "'builtins.KeyError']").click()
        click(driver, driver.find_element(By.ID, "filter"))
        assert set(rows(driver)) == set(other)

        driver.get(base + "/errors?endpoint=billing")
        assert set(rows(driver)) == set(boom)
        later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
        driver.get(base + f"/errors?since={later}")
        assert rows(driver) == {}
        earlier = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
        driver.get(base + f"/errors?since={earlier}&until={later}")
        assert set(rows(driver)) == set(boom + other)
        driver.get(base + "/errors?since=yesterday")
        assert "'yesterday' is not a date and time" in driver.find_element(By.ID, "problem").text


def test_retry_sends_the_message_back_and_it_is_processed(database, driver):
    transport = database.transport()
    first, second = fail(transport, "billing", [b"first", b"second"])
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        driver.get(base + "/errors")
        assert driver.find_element(By.ID, "mode").text == "retry and delete allowed"
        rows(driver)[first].find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
        click(driver, driver.find_element(By.ID, "retry-chosen"))
        assert "Retry these 1 message(s)" in driver.find_element(By.ID, "question").text
        assert first in driver.find_element(By.ID, "chosen-list").text
        assert error_ids(transport) == {first, second}  # asking changed nothing
        click(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.ID, "notice").text == "retried 1 message(s)"
        assert set(rows(driver)) == {second}
    assert error_ids(transport) == {second}
    handled: list[str] = []
    endpoint = Endpoint("billing", transport, settings=EndpointSettings(
        concurrency=1, peek_delay=0.1, immediate_retries=0, delayed_retries=0))

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        handled.append(context.message_id)
        assert body == b"first"  # byte for byte

    run_until(endpoint, lambda: endpoint.stats.handled == 1)
    assert handled == [first]
    assert transport.peek("billing") == 0


def test_delete_removes_exactly_the_chosen_messages(database, driver):
    transport = database.transport()
    ids = fail(transport, "billing", [b"1", b"2", b"3", b"4"])
    chosen = {ids[0], ids[2]}
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        driver.get(base + "/errors")
        for message_id, row in rows(driver).items():
            if message_id in chosen:
                row.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
        click(driver, driver.find_element(By.ID, "delete-chosen"))
        assert set(driver.find_element(By.ID, "chosen-list").text.split()) >= chosen
        click(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.ID, "notice").text == "deleted 2 message(s)"
        assert set(rows(driver)) == set(ids) - chosen

        # One message from its own page.
        click(driver, rows(driver)[ids[3]].find_element(By.TAG_NAME, "a"))
        click(driver, driver.find_element(By.ID, "delete-one"))
        click(driver, driver.find_element(By.ID, "confirm"))
        assert set(rows(driver)) == {ids[1]}
    assert error_ids(transport) == {ids[1]}
    assert transport.peek("billing") == 0  # deleted, not retried


def test_a_post_without_the_csrf_token_is_refused(database, driver):
    transport = database.transport()
    ids = fail(transport, "billing", [b"keep me"])
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        driver.get(base + "/errors")
        row_id = rows(driver)[ids[0]].get_attribute("data-id")
        # Same origin, the browser's own cookie, every field but the token.
        status = driver.execute_async_script(
            """const done = arguments[arguments.length - 1];
            fetch('/errors/delete', {method: 'POST', body: new URLSearchParams(
                {id: arguments[0], confirmed: 'yes'})}).then(r => done(r.status));""",
            row_id,
        )
        assert status == 403
        # A token of another browser (cookie) and a page of another origin are refused too.
        page = httpx.get(base + f"/errors/confirm?action=delete&id={row_id}")
        token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        cookies = dict(page.cookies)
        form = {"id": row_id, "confirmed": "yes", "csrf_token": token}
        assert httpx.post(base + "/errors/delete", data=form, cookies=cookies,
                          headers={"Origin": "http://evil.example"}).status_code == 403
        assert httpx.post(base + "/errors/delete", data=form, cookies=cookies).status_code == 403
        assert httpx.post(base + "/errors/delete", data=form, headers={"Origin": base},
                          cookies={"sqlqueue_dashboard_csrf": "another"}).status_code == 403
        assert httpx.get(base + "/errors/delete").status_code == 405  # POST only
        assert error_ids(transport) == set(ids)
        # The same request with the token, from the page's origin, passes.
        answer = httpx.post(base + "/errors/delete", data=form, cookies=cookies,
                            headers={"Origin": base})
        assert answer.status_code == 303
    assert error_ids(transport) == set()


# -- a visit from another site's link ----------------------------------------------------------
def link_page(target: str) -> Any:
    """Another site: one page with a link to *target*."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    async def page(request: Any) -> HTMLResponse:
        return HTMLResponse(f'<a id="to-dashboard" href="{target}">the queues</a>')

    return Starlette(routes=[Route("/", page)])


def test_a_visit_from_another_site_keeps_the_browsers_cookie(database):
    transport = database.transport()
    fail(transport, "billing", [b"delete me"])
    row_id = ErrorQueue(transport, "error").list()[0].id
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        page = httpx.get(base + f"/errors/confirm?action=delete&id={row_id}")
        assert "samesite=lax" in page.headers["set-cookie"].lower()  # sent with a link's visit
        cookies = dict(page.cookies)
        token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        # The dashboard opened from another site's link, with the cookie: it is kept.
        visit = httpx.get(base + "/", cookies=cookies, headers={
            "Referer": "http://elsewhere.example/", "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"})
        assert visit.status_code == 200 and "set-cookie" not in visit.headers
        # Another site's form (the browser sends it without the Lax cookie) is refused, and
        # its answer sets no cookie that would replace the browser's.
        refused = httpx.post(base + "/errors/delete", data={"id": row_id, "confirmed": "yes"},
                             headers={"Origin": "http://elsewhere.example",
                                      "Sec-Fetch-Site": "cross-site"})
        assert refused.status_code == 403 and "set-cookie" not in refused.headers
        # The confirmation's form, sent after both, still passes.
        answer = httpx.post(base + "/errors/delete", cookies=cookies, headers={"Origin": base},
                            data={"id": row_id, "confirmed": "yes", "csrf_token": token})
        assert answer.status_code == 303
    assert error_ids(transport) == set()


def test_a_confirmation_stays_valid_after_opening_the_dashboard_from_another_site(
    database, driver
):
    transport = database.transport()
    keep, delete = fail(transport, "billing", [b"keep me", b"delete me"])
    app = create_app(transport, allow_changes=True)
    requests: list[dict[str, str]] = []

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            requests.append({"path": scope["path"], **{
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in scope["headers"]}})
        await app(scope, receive, send)

    with browser.served(recorded) as base:
        # Another site: another host name (localhost is not 127.0.0.1 to the browser).
        with browser.served(link_page(base + "/")) as elsewhere:
            elsewhere = elsewhere.replace("127.0.0.1", "localhost")
            driver.get(base + "/errors")
            rows(driver)[delete].find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
            click(driver, driver.find_element(By.ID, "delete-chosen"))
            assert delete in driver.find_element(By.ID, "chosen-list").text
            confirmation = driver.current_window_handle

            # In another tab, the dashboard opened from a link of the other site.
            driver.switch_to.new_window("tab")
            try:
                driver.get(elsewhere + "/")
                click(driver, driver.find_element(By.ID, "to-dashboard"))
                assert driver.find_element(By.ID, "mode").text == "retry and delete allowed"
                visit = [r for r in requests if r["path"] == "/"][-1]
                assert visit["sec-fetch-site"] == "cross-site", visit
                assert visit["referer"].startswith(elsewhere), visit
            finally:
                driver.close()
                driver.switch_to.window(confirmation)

            click(driver, driver.find_element(By.ID, "confirm"))
            refused = driver.find_elements(By.ID, "problem")
            assert not refused, refused[0].text
            assert driver.find_element(By.ID, "notice").text == "deleted 1 message(s)"
    assert error_ids(transport) == {keep}
