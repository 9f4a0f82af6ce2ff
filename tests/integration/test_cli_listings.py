"""Every listing has ``--json``; an empty one is ``[]`` with it and a line saying "none"
without it, so a script always reads JSON and a person never reads nothing."""

from __future__ import annotations

import json

from sqlqueue_orm import OutgoingMessage
from tests.conftest import only
from tests.integration.cli_process import sqlqueue


def _out(database, tmp_path, *args: str) -> str:
    result = sqlqueue("--url", database.url, *args, cwd=tmp_path)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


@only("sqlite", "postgresql")
def test_empty_listings_say_none_or_print_an_empty_json_array(database, tmp_path):
    transport = database.transport()
    assert _out(database, tmp_path, "list-queues") == "no queues\n"
    assert _out(database, tmp_path, "list-queues", "--json") == "[]\n"
    assert _out(database, tmp_path, "delayed", "list") == "no delayed messages\n"
    assert _out(database, tmp_path, "delayed", "list", "--json") == "[]\n"
    transport.create_queues(["error", "orders"])
    transport.create_subscription_table()
    assert _out(database, tmp_path, "errors", "list") == (
        "no failed messages found in error queue 'error'\n"
    )
    assert _out(database, tmp_path, "errors", "list", "--json") == "[]\n"
    assert _out(database, tmp_path, "subscriptions") == "no subscriptions\n"
    assert _out(database, tmp_path, "subscriptions", "--json") == "[]\n"
    assert _out(database, tmp_path, "browse", "orders") == "no messages in queue 'orders'\n"
    assert _out(database, tmp_path, "browse", "orders", "--json") == "[]\n"


@only("sqlite", "postgresql")
def test_list_queues_json_gives_each_queue_and_its_count(database, tmp_path):
    transport = database.transport()
    transport.create_queues(["orders", "audit"])
    transport.send("orders", OutgoingMessage(b"x"))
    lines = _out(database, tmp_path, "list-queues", "--json").splitlines()
    records = sorted((json.loads(line) for line in lines), key=lambda record: record["queue"])
    assert records == [{"queue": "audit", "count": 0}, {"queue": "orders", "count": 1}]
    assert sorted(_out(database, tmp_path, "list-queues").splitlines()) == [
        "audit\t0", "orders\t1",
    ]


@only("sqlite")
def test_verify_json_without_drift_is_an_empty_array(database, tmp_path):
    migrated = sqlqueue("--url", database.url, "migrate", cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert _out(database, tmp_path, "verify", "--json") == "[]\n"
    assert _out(database, tmp_path, "verify").startswith("verified: no drift on the ")
