"""``sqlqueue errors``: list, show, retry, delete against real databases.

Run in this process through ``cli.main`` (a subprocess costs a second or more each on a busy
machine); one bad id runs as a real subprocess to prove the exit status and the one line.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid

import pytest

from sqlqueue_orm import OutgoingMessage, cli, headers
from tests.conftest import only
from tests.integration.test_cli import sqlqueue as sqlqueue_process


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def sqlqueue(capsys):
    def run(url, *args, check=True):
        capsys.readouterr()
        status = cli.main(["--url", url, *args])
        out, err = capsys.readouterr()
        assert status == 0 or not check, (status, err)
        return Result(status, out, err)

    return run

BODY = b"\xff\x00 not text"


def fail(transport, queue, message_id, exception_type="builtins.ValueError"):
    transport.send("error", OutgoingMessage(BODY, message_id=message_id, headers={
        headers.FAILED_QUEUE: transport.address_text(queue),
        headers.EXCEPTION_TYPE: exception_type,
        headers.EXCEPTION_MESSAGE: f"{message_id} failed",
        headers.EXCEPTION_HELP_LINK: None,
        headers.TIME_OF_FAILURE: "2026-01-02 03:04:05:000006 Z",
        headers.PROCESSING_ENDPOINT: queue,
    }))


def test_errors_list_show_retry_delete(database, sqlqueue):
    transport = database.transport()
    transport.create_queues(["error", "inbox", "other"])
    fail(transport, "inbox", "a")
    fail(transport, "other", "b", "Sales.OrderRejected")
    fail(transport, "other", "c")
    url = database.url

    listed = [json.loads(line) for line in sqlqueue(url, "errors", "list", "--json")
              .stdout.splitlines()]
    assert [each["message_id"] for each in listed] == ["a", "b", "c"]
    first = listed[0]
    assert first["failed_queue"] == transport.address_text("inbox")
    assert first["exception_type"] == "builtins.ValueError"
    assert first["time_of_failure"] == "2026-01-02 03:04:05:000006 Z"
    assert first["headers"][headers.EXCEPTION_HELP_LINK] is None
    assert base64.b64decode(first["body_base64"]) == BODY
    ids = {each["message_id"]: each["id"] for each in listed}

    _, line = sqlqueue(url, "errors", "list", "--exception-type", "OrderRejected").stdout.split(
        "\n", 1)
    assert line.split()[0] == "b" and "b failed" in line and len(line.splitlines()) == 1
    _, *lines = sqlqueue(url, "errors", "list", "--endpoint", "other").stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["b", "c"]

    shown = json.loads(sqlqueue(url, "errors", "show", ids["a"]).stdout)
    assert shown == first

    # Bad ids: one line naming the id, exit 2, nothing changed.
    for args in (("show", "nope"), ("retry", ids["a"], "nope"), ("delete", str(uuid.uuid4()))):
        result = sqlqueue(url, "errors", *args, check=False)
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1
        assert repr(args[-1]) in result.stderr and "Traceback" not in result.stderr
    real = sqlqueue_process(url, "errors", "retry", ids["a"], "not-an-id", check=False)
    assert real.returncode == 2
    assert real.stderr.splitlines() == [
        "sqlqueue: error: no message 'not-an-id' in error queue 'error': no message id or row "
        'id is that (see: sqlqueue errors list --url "$SQLQUEUE_URL")'
    ]
    assert len(sqlqueue(url, "errors", "list").stdout.splitlines()) == 1 + 3

    assert "1 message(s) sent back" in sqlqueue(url, "errors", "retry", ids["a"]).stdout
    [back] = transport.receive("inbox")
    assert back.message_id == "a" and back.body == BODY
    assert headers.FAILED_QUEUE not in back.headers
    assert headers.EXCEPTION_TYPE not in back.headers

    assert "1 message(s) deleted" in sqlqueue(url, "errors", "delete", ids["b"]).stdout
    assert "1 message(s) sent back" in sqlqueue(
        url, "errors", "retry", "--all", "--failed-queue", "other").stdout
    assert [m.message_id for m in transport.receive("other", 10)] == ["c"]
    assert sqlqueue(url, "errors", "list").stdout == (
        "no failed messages found in error queue 'error'\n"
    )


def test_errors_commands_on_another_error_queue(database, sqlqueue):
    transport = database.transport()
    transport.create_queues(["failures", "inbox"])
    transport.send("failures", OutgoingMessage(b"x", message_id="m", headers={
        headers.FAILED_QUEUE: transport.address_text("inbox")}))
    assert sqlqueue(database.url, "errors", "list", "--queue", "failures").stdout.strip()
    result = sqlqueue(database.url, "errors", "retry", "--all", "--queue", "failures")
    assert "1 message(s) sent back from failures" in result.stdout
    assert [m.message_id for m in transport.receive("inbox")] == ["m"]
    missing = sqlqueue(database.url, "errors", "list", check=False)  # no "error" queue here
    assert missing.returncode == 2 and "'error' does not exist" in missing.stderr


def test_retry_all_exits_1_when_a_message_could_not_go_back(database, sqlqueue):
    """``--all`` sends back what it can; one that names a queue that is gone stays, and the
    command says so and exits 1 (as retrying by id does)."""
    transport = database.transport()
    transport.create_queues(["error", "inbox"])
    transport.send("error", OutgoingMessage(b"x", message_id="ok", headers={
        headers.FAILED_QUEUE: transport.address_text("inbox")}))
    transport.send("error", OutgoingMessage(b"x", message_id="orphan", headers={
        headers.FAILED_QUEUE: transport.address_text("gone_since")}))
    result = sqlqueue(database.url, "errors", "retry", "--all", check=False)
    assert result.returncode == 1, result
    assert "1 message(s) sent back" in result.stdout
    assert "1 message(s) were not sent back" in result.stderr
    assert [m.message_id for m in transport.receive("inbox")] == ["ok"]
    assert [m.message_id for m in transport.browse("error")] == ["orphan"]


def test_errors_commands_take_the_message_id_and_the_list_heads_its_columns(database, sqlqueue):
    transport = database.transport()
    transport.create_queues(["error", "billing"])
    fail(transport, "billing", "order-7")
    fail(transport, "billing", "twice")
    fail(transport, "billing", "twice")
    url = database.url
    rows = {(each["message_id"], each["id"]) for each in map(
        json.loads, sqlqueue(url, "errors", "list", "--json").stdout.splitlines())}
    [row_id] = [row for message, row in rows if message == "order-7"]

    heading, *lines = sqlqueue(url, "errors", "list").stdout.splitlines()
    assert heading.split() == ["MESSAGE", "ID", "FAILED", "AT", "(UTC)", "QUEUE", "EXCEPTION"]
    assert [line.split()[0] for line in lines] == ["order-7", "twice", "twice"]
    # The failed queue as every other listing shows it ("billing"), also where the header
    # holds the PostgreSQL transport's "public"."billing"; JSON keeps the header as stored.
    assert [line.split()[4] for line in lines] == ["billing"] * 3
    assert heading.index("QUEUE") == lines[0].index("billing")
    stored = json.loads(sqlqueue(url, "errors", "show", "order-7").stdout)
    assert stored["failed_queue"] == transport.address_text("billing")

    # The message id the endpoint's log and the dashboard show, or the row id.
    for given in ("order-7", row_id, row_id.upper()):
        shown = json.loads(sqlqueue(url, "errors", "show", given).stdout)
        assert (shown["message_id"], shown["id"]) == ("order-7", row_id)
    ambiguous = sqlqueue(url, "errors", "retry", "twice", check=False)
    assert ambiguous.returncode == 2, ambiguous
    [line] = ambiguous.stderr.splitlines()
    twice = sorted(row for message, row in rows if message == "twice")
    assert "2 messages" in line and "'twice'" in line and all(row in line for row in twice)
    assert "1 message(s) sent back" in sqlqueue(url, "errors", "retry", "order-7").stdout
    [back] = transport.receive("billing")
    assert back.message_id == "order-7"
    assert "1 message(s) deleted" in sqlqueue(url, "errors", "delete", twice[0]).stdout
    assert "1 message(s) sent back" in sqlqueue(url, "errors", "retry", "twice").stdout
    assert sqlqueue(url, "errors", "list").stdout == (
        "no failed messages found in error queue 'error'\n"
    )


def test_plain_listings_print_one_line_per_message_whatever_the_values_hold(database, sqlqueue):
    transport = database.transport()
    transport.create_queues(["error", "billing"])
    transport.send("error", OutgoingMessage(b"x", message_id="evil\nid", headers={
        headers.FAILED_QUEUE: transport.address_text("billing"),
        headers.EXCEPTION_TYPE: "Bad\r\nType\u202e",
        headers.EXCEPTION_MESSAGE: "one\ttwo\x1b[31m",
        headers.EXCEPTION_STACK_TRACE: "Traceback\n",
    }))
    transport.send("billing", OutgoingMessage("body\twith\x1b tab", message_id="b\u2028c\rd"))
    url = database.url

    _heading, line = sqlqueue(url, "errors", "list").stdout.splitlines()
    assert line.startswith("evil\\nid  ")
    assert "Bad\\r\\nType\\u202e" in line and "\x1b" not in line and "\t" not in line
    _heading, group = sqlqueue(url, "errors", "groups").stdout.splitlines()
    assert "Bad\\r\\nType\\u202e" in group
    [browsed] = sqlqueue(url, "browse", "billing").stdout.splitlines()
    assert browsed == "b\\u2028c\\rd: body\\twith\\x1b tab"
    transport.create_subscription_table()
    transport.subscribe("evil\nendpoint", "Sales.Topic\x1b", queue="billing")
    [subscription] = sqlqueue(url, "subscriptions").stdout.splitlines()
    assert "evil\\nendpoint" in subscription and "Sales.Topic\\x1b" in subscription
    transport.create_delayed_table("billing")
    transport.send("billing", OutgoingMessage(b"later", message_id="late\nid"), delay=3600,
                   endpoint="billing")
    [delayed] = sqlqueue(url, "delayed", "list").stdout.splitlines()
    assert "late\\nid" in delayed
    # JSON is unchanged: every value exactly (U+2028 as itself, one JSON line all the same).
    [record] = sqlqueue(url, "browse", "billing", "--json").stdout.rstrip("\n").split("\n")
    assert json.loads(record)["message_id"] == "b\u2028c\rd"
    [record] = sqlqueue(url, "errors", "list", "--json").stdout.splitlines()
    assert json.loads(record)["exception_type"] == "Bad\r\nType\u202e"


@only("sqlite")
def test_an_error_line_escapes_the_control_characters_of_the_value_it_names(
    database, capsys, tmp_path
):
    missing = tmp_path / "no\x1b[31mfile\u202e.db"
    capsys.readouterr()
    assert cli.main(["--url", f"sqlite:///{missing}", "peek", "orders"]) == 1
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert "no\\x1b[31mfile\\u202e.db does not exist" in line
    assert line.isprintable() and out == ""
