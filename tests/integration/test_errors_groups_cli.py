"""``sqlqueue errors groups``, ``retry --group``, ``delete --group`` and the list's search.

The group commands run as real subprocesses (exit status, one line on bad input); the list's
filters and paging run in this process through ``cli.main`` (a subprocess costs a second each).
"""

from __future__ import annotations

import json

from sqlqueue_orm import OutgoingMessage, headers
from tests.integration.test_cli import sqlqueue as sqlqueue_process
from tests.integration.test_errors_cli import sqlqueue  # noqa: F401  (a fixture)
from tests.integration.test_failure_groups import fail, fail_dotnet


def test_groups_json_retry_and_delete_a_group(database):
    transport = database.transport()
    transport.create_queues(["error", "inbox", "other", "billing"])
    for number in range(3):
        fail(transport, f"v{number}", text=f"order {number}", line=number)
    fail(transport, "k", kind="builtins.KeyError", endpoint="other")
    fail_dotnet(transport, "d", order=1, line=2)
    url = database.url

    listed = [json.loads(line) for line in
              sqlqueue_process(url, "errors", "groups", "--json").stdout.splitlines()]
    assert [(g["count"], g["label"]) for g in listed] == [
        (3, "builtins.ValueError: at orders.py:process"),
        (1, "System.InvalidOperationException: at Sales.PlaceOrderHandler.<Handle>d__.MoveNext()"),
        (1, "builtins.KeyError: at orders.py:process"),
    ]
    assert listed[0]["first_failure"] == "2026-01-02 03:04:05:000006 Z"
    assert {g["by"] for g in listed} == {"type"}
    heading, *lines = sqlqueue_process(url, "errors", "groups", "--by", "endpoint").stdout.split(
        "\n")[:-1]
    assert heading.split() == ["GROUP", "MESSAGES", "FIRST", "FAILURE", "LAST", "FAILURE",
                               "LABEL"]
    assert [(line.split()[1], line.split()[-1]) for line in lines] == [
        ("3", "inbox"), ("1", "Billing"), ("1", "other")]
    assert heading.index("LABEL") == lines[0].index("inbox")

    done = sqlqueue_process(url, "errors", "retry", "--group", listed[0]["id"])
    assert done.stdout.strip() == "3 message(s) sent back from error"
    assert sorted(m.message_id for m in transport.receive("inbox", 10)) == ["v0", "v1", "v2"]
    again = sqlqueue_process(url, "errors", "retry", "--group", listed[0]["id"], check=False)
    assert again.returncode == 2
    assert again.stderr.splitlines() == [
        f"sqlqueue: error: no failure group {listed[0]['id']!r} in error queue 'error' "
        "(see: sqlqueue errors groups)"
    ]
    done = sqlqueue_process(url, "errors", "delete", "--group", listed[1]["id"])
    assert done.stdout.strip() == "1 message(s) deleted from error"
    assert [m.message_id for m in transport.browse("error", 10)] == ["k"]
    bad = sqlqueue_process(url, "errors", "delete", "--group", "nope", check=False)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "'nope'" in bad.stderr
    bad = sqlqueue_process(url, "errors", "groups", "--by", "colour", check=False)
    assert bad.returncode == 2 and "'colour'" in bad.stderr and "Traceback" not in bad.stderr


def test_list_filters_and_pages_through_every_row(database, sqlqueue):  # noqa: F811
    transport = database.transport()
    transport.create_queues(["error", "inbox"])
    for number in range(7):
        transport.send("error", OutgoingMessage(
            f"body of order {number}".encode(), message_id=f"m{number}", headers={
                headers.FAILED_QUEUE: transport.address_text("inbox"),
                "Tenant": f"t{number % 2}",
            }))
    url = database.url

    seen, args = [], ["errors", "list", "--limit", "3"]
    while True:
        result = sqlqueue(url, *args)
        seen += [json.loads(line)["message_id"] for line in
                 sqlqueue(url, *args, "--json").stdout.splitlines()]
        if not result.stderr:
            break
        after = result.stderr.split("--after ")[1].split()[0]
        args = ["errors", "list", "--limit", "3", "--after", after]
    assert seen == [f"m{n}" for n in range(7)]

    def ids(*filters):
        out = sqlqueue(url, "errors", "list", "--json", *filters).stdout
        return [json.loads(line)["message_id"] for line in out.splitlines() if line != "[]"]

    assert ids("--header", "Tenant=t1") == ["m1", "m3", "m5"]
    assert ids("--search", "order 4") == ["m4"]
    assert ids("--message-id", "m6") == ["m6"]
    assert ids("--search", "nothing like it") == []
    bad = sqlqueue(url, "errors", "list", "--after", "later", check=False)
    assert bad.returncode == 2 and "'later'" in bad.stderr

    result = sqlqueue(url, "errors", "retry", "--all", "--header", "Tenant=t0", "--most", "3",
                      check=False)
    assert result.returncode == 2 and "more than 3" in result.stderr
    assert "4 message(s) sent back" in sqlqueue(
        url, "errors", "retry", "--all", "--header", "Tenant=t0").stdout
    assert sorted(m.message_id for m in transport.receive("inbox", 10)) == [
        "m0", "m2", "m4", "m6"]
    assert "3 message(s) deleted" in sqlqueue(
        url, "errors", "delete", "--all", "--search", "body of").stdout
    refused = sqlqueue(url, "errors", "delete", "--all", check=False)
    assert refused.returncode == 2 and "needs a filter" in refused.stderr
