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

    text = sqlqueue(url, "errors", "list", "--exception-type", "OrderRejected").stdout
    assert text.split()[0] == ids["b"] and "b failed" in text and len(text.splitlines()) == 1
    text = sqlqueue(url, "errors", "list", "--endpoint", "other").stdout
    assert [line.split()[0] for line in text.splitlines()] == [ids["b"], ids["c"]]

    shown = json.loads(sqlqueue(url, "errors", "show", ids["a"]).stdout)
    assert shown == first

    # Bad ids: one line naming the id, exit 2, nothing changed.
    for args in (("show", "nope"), ("retry", ids["a"], "nope"), ("delete", str(uuid.uuid4()))):
        result = sqlqueue(url, "errors", *args, check=False)
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1
        assert repr(args[-1]) in result.stderr and "Traceback" not in result.stderr
    real = sqlqueue_process(url, "errors", "retry", ids["a"], "not-a-guid", check=False)
    assert real.returncode == 2
    assert real.stderr.splitlines() == [
        "sqlqueue: error: 'not-a-guid' is not an error-queue message id (a GUID such as "
        "'0b0e4b6c-8c4e-4c1e-9f58-6d1b3a2a9f10')"
    ]
    assert len(sqlqueue(url, "errors", "list").stdout.splitlines()) == 3

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
