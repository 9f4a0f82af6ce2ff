"""What the dashboard's pages claim, in a real browser (headless Chromium) on a real database.

A rate is shown only over a window it can claim: an instance that ran for a fraction of a second
shows its counts alone, one that beat for longer than a minute its rates too; a queue's rate is
what its last five minutes hold, over five. The Control page
lists endpoints (instances that beat, control rows), never a queue no endpoint ever ran on. The
Outbox page on a database without the outbox table says so and names the command creating it;
with it, it counts the records a failed dispatch deferred apart and says what each figure counts.
"""

from __future__ import annotations

import time
import uuid

import pytest

from sqlqueue_orm import OutgoingMessage, control, health
from sqlqueue_orm.models.outbox import outbox_table
from sqlqueue_orm.sending.outbox import Outbox, OutboxOperation
from tests.integration.test_dashboard_browser import By, driver, fail  # noqa: F401
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app


def beat_for_two_minutes(transport: object, endpoint: str) -> None:
    """The heartbeat row of an instance of *endpoint* that started two minutes ago."""
    engine = transport.engine  # type: ignore[attr-defined]
    health.create_tables(engine)
    health.beat(engine, health.Heartbeat(
        instance_id=uuid.uuid4().hex, endpoint=endpoint, host="elsewhere", process_id=7,
        started_at=time.time() - 120, beat_interval=5.0, concurrency=1, in_flight=0,
        processed=40, failed=2, processed_rate=12.0, failed_rate=1.0))


def test_rates_only_over_a_minute_and_control_lists_endpoints_only(database, driver):  # noqa: F811
    transport = database.transport()
    fail(transport, "billing", [b"one"])  # an endpoint run of a fraction of a second
    beat_for_two_minutes(transport, "shipping")
    transport.create_queues(["orders", "sales"])  # no endpoint ever ran on either
    control.pause(transport, "sales")  # a control row of its own
    app = create_app(transport, allow_changes=True)
    with browser.served(app) as base:
        driver.get(base + "/endpoints")
        cells = {
            row.get_attribute("data-endpoint"): (
                row.find_element(By.CSS_SELECTOR, ".processed").text,
                row.find_element(By.CSS_SELECTOR, ".failed").text,
            )
            for row in driver.find_elements(By.CSS_SELECTOR, "#endpoints tr[data-endpoint]")
        }
        assert cells == {"billing": ("0", "1"), "shipping": ("40 (12.0)", "2 (1.0)")}

        driver.get(base + "/control")
        listed = {
            row.get_attribute("data-endpoint"): row.find_element(By.CSS_SELECTOR, ".state").text
            for row in driver.find_elements(By.CSS_SELECTOR, "#endpoints tr[data-endpoint]")
        }
        assert listed == {"billing": "running", "sales": "paused", "shipping": "running"}


def test_the_outbox_page_without_the_table_names_the_command_creating_it(database, driver):  # noqa: F811
    transport = database.transport()
    with browser.served(create_app(transport)) as base:
        driver.get(base + "/outbox")
        said = driver.find_element(By.ID, "no-outbox").text
    assert "outdated" not in said
    assert "OutboxData" in said and "does not exist" in said
    assert "sqlqueue migrate" in said


def test_the_outbox_page_counts_the_records_a_failed_dispatch_deferred_and_says_what_it_counts(
    database, driver  # noqa: F811
):
    """Waiting for a retry: the records a failed send deferred in the table. A record a
    dispatcher skips in memory for want of a route is due in the table (a dispatcher that has
    the route sends it at once): counted waiting for dispatch, and the page says so."""
    transport = database.transport()
    transport.create_queue("billing")
    outbox = Outbox(transport)
    outbox.create_table()
    with transport.engine.begin() as connection:
        for record_id, queue in (("unreadable", "billing"), ("elsewhere", "ledger")):
            outbox.store(connection, record_id, [OutboxOperation.from_prepared(
                queue, OutgoingMessage(b"x", message_id=record_id).prepare())])
        table = outbox_table()
        connection.execute(
            table.update().where(table.c.MessageId == "unreadable").values(Operations="[{")
        )
    report = outbox.dispatch_due(retry_delay=3600)
    assert (report.claimed, report.deferred) == (2, 2)
    assert (outbox.waiting_for_retry(), outbox.skipped_for_route()) == (1, 1)
    with browser.served(create_app(transport)) as base:
        driver.get(base + "/outbox")
        pending = driver.find_element(By.ID, "pending").text
        retrying = driver.find_element(By.ID, "waiting-for-retry").text
        said = driver.find_element(By.ID, "outbox-counts").text
    outbox.close()
    assert (pending, retrying) == ("2", "1")
    assert "route" in said and "at once" in said


def test_queue_rates_are_over_the_last_five_minutes_not_the_last_five_samples(database, driver):  # noqa: F811
    transport = database.transport()
    transport.create_queue("billing")
    health.create_tables(transport.engine)
    now = time.time()
    health.write_samples(transport.engine, uuid.uuid4().hex, [  # a burst half an hour ago
        ("billing", health.QueueSample(now - 1800, 0, None, 500, 100))])
    health.write_samples(transport.engine, uuid.uuid4().hex, [  # a --once run just now
        ("billing", health.QueueSample(now - 1, 0, None, 10, 1))])
    with browser.served(create_app(transport)) as base:
        driver.get(base + "/")
        row = 'tr[data-queue="billing"]'
        queues = [driver.find_element(By.CSS_SELECTOR, f"{row} .{field}").text
                  for field in ("processed", "failed")]
        driver.get(base + "/queue?name=billing")
        queue = [driver.find_element(By.CSS_SELECTOR, f"#metrics-latest .{field}").text
                 for field in ("processed", "failed")]
    assert queues == queue == ["2.0", "0.2"]  # what the last five minutes hold, over five
