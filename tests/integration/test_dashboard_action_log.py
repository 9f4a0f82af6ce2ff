"""Every change made from the dashboard is logged as docs/dashboard.md shows it.

Each action goes through its confirmation page's own form (hidden fields, CSRF token, cookie)
from a real HTTP client: the log line names the queue, what was done, to which messages (their
row ids, or the group), and the client's address.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any

import httpx
import pytest

from sqlqueue_orm.recoverability.error_queue import ErrorQueue
from sqlqueue_orm.recoverability.groups import FailureGroups
from tests.integration.test_failure_groups import fail
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
from sqlqueue_orm.contrib.dashboard import create_app

_FORM = re.compile(r'<form method="post" action="([^"]+)">(.*?)</form>', re.S)
_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')


def confirm(client: httpx.Client, base: str, page: str) -> tuple[str, str]:
    """Press the confirm button of *page*; return where it leads and the client's address."""
    asked = client.get(base + page)
    assert asked.status_code == 200, asked.text
    action, inputs = _FORM.search(asked.text).groups()  # type: ignore[union-attr]
    fields: dict[str, list[str]] = {}
    for name, value in _HIDDEN.findall(inputs):
        fields.setdefault(name, []).append(html.unescape(value))
    answer = client.post(base + html.unescape(action), data=fields,
                         headers={"Origin": base}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    stream: Any = answer.extensions["network_stream"]
    host, port = stream.get_extra_info("client_addr")
    return answer.headers["location"], f"{host}:{port}"


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "sqlqueue_orm.contrib.dashboard"
            and record.levelno == logging.INFO]


def test_every_dashboard_action_is_logged_with_the_client_address(database, caplog):
    transport = database.transport()
    transport.create_queues(["error", "inbox", "other"])
    for number in range(3):
        fail(transport, f"v{number}")
    fail(transport, "k0", kind="builtins.KeyError", endpoint="other")
    fail(transport, "k1", kind="builtins.KeyError", endpoint="other")
    errors = ErrorQueue(transport, "error")
    rows = {message.message_id: message.id for message in errors.list()}
    value_group, key_group = (g.id for g in FailureGroups(errors).list())
    app = create_app(transport, allow_changes=True)
    caplog.set_level(logging.INFO, logger="sqlqueue_orm.contrib.dashboard")
    with browser.served(app) as base, httpx.Client(base_url=base) as client:
        done = []
        for page in (
            f"/errors/confirm?action=retry&id={rows['k0']}",
            f"/errors/confirm?action=delete&id={rows['v0']}",
            f"/errors/groups/confirm?action=retry&group={value_group}",
            f"/errors/groups/confirm?action=delete&group={key_group}",
            "/control/confirm?endpoint=inbox&action=pause",
            "/errors/confirm?action=retry_all",
        ):
            done.append(confirm(client, base, page))
    logged = lines(caplog)
    (_, first), (_, second), (_, third), (_, fourth), (_, fifth), (_, sixth) = done
    assert logged[0] == f"queue error: dashboard retried 1 message(s) ({rows['k0']}) for {first}"
    assert logged[1] == f"queue error: dashboard deleted 1 message(s) ({rows['v0']}) for {second}"
    assert logged[2] == (
        f"queue error: dashboard retried 2 message(s) of group {value_group} for {third}")
    assert logged[3] == (
        f"queue error: dashboard deleted 1 message(s) of group {key_group} for {fourth}")
    assert logged[4].startswith("queue inbox: dashboard: paused inbox, by ")
    assert logged[4].endswith(f" from {fifth}")
    assert logged[5] == f"queue error: dashboard retried all 0 message(s) for {sixth}"
    assert len(logged) == 6
