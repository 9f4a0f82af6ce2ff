"""The sqlqueue command line, run as a real subprocess against real databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import only


def sqlqueue(url, *args, check=True):
    env = {**os.environ, "SQLQUEUE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", *args],
        capture_output=True,
        text=True,
        check=check,
        env=env,
        timeout=120,
    )


@only("sqlite", "postgresql", "mssql")
def test_create_send_receive_json_round_trip(database):
    url = database.url
    assert sqlqueue(url, "create-queue", "orders", "audit").stdout.split() == [
        "created", "orders", "created", "audit",
    ]
    assert "exists" in sqlqueue(url, "create-queue", "orders").stdout
    message_id = sqlqueue(
        url, "send", "orders", "--body", "héllo/wörld", "--header", "a/b=c=d", "--ttbr", "60"
    ).stdout.strip()
    sqlqueue(url, "send", "orders", "--body", "second")
    assert sqlqueue(url, "peek", "orders").stdout.strip() == "2"
    listed = dict(line.split("\t") for line in sqlqueue(url, "list-queues").stdout.splitlines())
    assert listed == {"audit": "0", "orders": "2"}
    lines = sqlqueue(url, "receive", "orders", "--count", "5", "--json").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["body"] for r in records] == ["héllo/wörld", "second"]
    assert records[0]["message_id"] == message_id
    assert records[0]["headers"]["a/b"] == "c=d"
    assert records[0]["headers"]["NServiceBus.TimeToBeReceived"] == "00:01:00"
    assert records[0]["expired"] is False
    assert set(records[0]) == {"id", "message_id", "headers", "body", "expired"}
    assert sqlqueue(url, "receive", "orders", "--json").stdout == ""
    assert sqlqueue(url, "purge-expired", "orders").stdout.strip() == "0"


@only("sqlite")
def test_bad_input_exits_2_naming_the_value(database):
    result = sqlqueue(database.url, "receive", "orders", "--count", "0", check=False)
    assert result.returncode == 2 and "'0'" in result.stderr
    result = sqlqueue(
        database.url, "send", "orders", "--body", "x", "--header", "nokey", check=False
    )
    assert result.returncode == 2 and "nokey" in result.stderr
    result = sqlqueue(database.url, "send", "nowhere", "--body", "x", check=False)
    assert result.returncode == 2 and "sqlqueue create-queue nowhere" in result.stderr
    result = sqlqueue(database.url, "send", "a@b@c@d", "--body", "x", check=False)
    assert result.returncode == 2 and "a@b@c@d" in result.stderr
