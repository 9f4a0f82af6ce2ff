"""The queue a message failed in is shown one way, as the listings of queues show it (its short
name in the default schema), on the dashboard's error pages as in ``sqlqueue errors list``; the
``NServiceBus.FailedQ`` header keeps the address as stored."""

from __future__ import annotations

import html

import httpx
import pytest

from sqlqueue_orm import OutgoingMessage, headers
from sqlqueue_orm.recoverability import ErrorQueue
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


def test_the_dashboard_shows_the_failed_queue_by_its_short_name(database):
    from sqlqueue_orm.contrib.dashboard import create_app

    transport = database.transport()
    transport.create_queues(["error", "billing"])
    stored = transport.address_text("billing")  # "public"."billing" on PostgreSQL
    transport.send("error", OutgoingMessage(b"x", message_id="order-7", headers={
        headers.FAILED_QUEUE: stored,
        headers.EXCEPTION_TYPE: "builtins.ValueError",
    }))
    [failed] = ErrorQueue(transport).list()
    assert failed.failed_queue == stored
    dashboard = create_app(transport, allow_changes=True)
    try:
        with browser.served(dashboard) as base:
            pages = [
                httpx.get(base + "/errors", timeout=30).text,
                httpx.get(base + "/errors/message", params={"id": failed.id}, timeout=30).text,
                httpx.get(base + "/errors/confirm", params={"id": failed.id, "action": "retry"},
                          timeout=30).text,
            ]
    finally:
        dashboard.state.dashboard.close()
    for page in pages:
        text = html.unescape(page)
        assert "billing" in text
        # The message's headers are listed as stored: the header row only.
        header_row = f"<th>{headers.FAILED_QUEUE}</th><td>{stored}</td>"
        assert stored == "billing" or stored not in text.replace(header_row, "")
