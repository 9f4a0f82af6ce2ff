"""ErrorQueue: list, get, count are non-destructive; retry and delete take one row each, once."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest

from sqlqueue_orm import ConfigurationError, OutgoingMessage, headers
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.recoverability import ErrorQueue

BODY = bytes(range(256))  # every byte value, so "byte for byte" means something


def failed(transport, queue, *, message_id, exception_type="builtins.ValueError",
           endpoint="inbox", at="2026-01-02 03:04:05:000006 Z", body=BODY):
    """Put a message in the error queue as an endpoint moving it there would."""
    transport.send("error", OutgoingMessage(body, message_id=message_id, headers={
        headers.FAILED_QUEUE: transport.address_text(queue),
        headers.TIME_OF_FAILURE: at,
        headers.EXCEPTION_TYPE: exception_type,
        headers.EXCEPTION_MESSAGE: "boom",
        headers.EXCEPTION_HELP_LINK: None,
        headers.EXCEPTION_STACK_TRACE: "Traceback ...",
        headers.PROCESSING_ENDPOINT: endpoint,
        headers.PROCESSING_MACHINE: "host",
        "NServiceBus.Retries": "3",
        "Custom": "kept",
    }))


@pytest.fixture
def transport(database):
    transport = database.transport()
    for queue in ("error", "inbox", "other"):
        transport.create_queue(queue)
    return transport


def test_list_get_count_read_without_taking(transport):
    failed(transport, "inbox", message_id="a")
    failed(transport, "other", message_id="b", exception_type="Sales.OrderRejected",
           endpoint="other", at="2026-01-03 00:00:00:000000 Z")
    errors = ErrorQueue(transport)
    listed = errors.list()
    assert [each.message_id for each in listed] == ["a", "b"]
    first = listed[0]
    assert first.failed_queue == transport.address_text("inbox")
    assert first.exception_type == "builtins.ValueError"
    assert first.exception_message == "boom"
    assert first.time_of_failure == dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert first.processing_endpoint == "inbox"
    assert first.headers[headers.EXCEPTION_HELP_LINK] is None
    assert '"NServiceBus.ExceptionInfo.HelpLink":null' in first.raw_headers
    assert first.body == BODY
    assert errors.get(first.id) == first
    assert errors.get(str(uuid.uuid4())) is None
    assert [m.message_id for m in errors.list(exception_type="ValueError")] == ["a"]
    assert [m.message_id for m in errors.list(exception_type="Sales.OrderRejected")] == ["b"]
    assert [m.message_id for m in errors.list(endpoint="other")] == ["b"]
    assert [m.message_id for m in errors.list(since=dt.datetime(2026, 1, 3))] == ["b"]
    assert [m.message_id for m in errors.list(until=dt.datetime(2026, 1, 3))] == ["a"]
    assert len(errors.list(limit=1)) == 1
    assert errors.count() == 2  # nothing was taken


def test_retry_sends_back_without_failure_headers_and_delete_removes(transport):
    failed(transport, "inbox", message_id="a")
    failed(transport, "other", message_id="b")
    failed(transport, "other", message_id="c")
    errors = ErrorQueue(transport)
    by_id = {each.message_id: each.id for each in errors.list()}
    assert errors.retry([by_id["a"]]) == 1
    assert errors.retry([by_id["a"]]) == 0  # gone: not sent twice
    [back] = transport.receive("inbox")
    assert back.message_id == "a"
    assert back.body == BODY
    assert back.headers["Custom"] == "kept"
    for removed in (headers.FAILED_QUEUE, headers.TIME_OF_FAILURE, headers.EXCEPTION_TYPE,
                    headers.EXCEPTION_HELP_LINK, headers.PROCESSING_ENDPOINT,
                    "NServiceBus.Retries"):
        assert removed not in back.headers
    assert errors.delete([by_id["b"]]) == 1
    assert errors.delete([by_id["b"]]) == 0
    assert errors.retry_all(failed_queue="inbox") == 0  # only "c" is left, from "other"
    assert errors.retry_all() == 1
    assert [m.message_id for m in transport.receive("other", 10)] == ["c"]
    assert errors.count() == 0


def test_a_message_whose_queue_is_gone_stays_and_the_rest_go_back(transport):
    failed(transport, "inbox", message_id="a")
    transport.send("error", OutgoingMessage(b"x", message_id="gone", headers={
        headers.FAILED_QUEUE: transport.address_text("dropped")}))
    failed(transport, "other", message_id="b")
    errors = ErrorQueue(transport)
    assert errors.retry_all() == 2
    assert [each.message_id for each in errors.list()] == ["gone"]
    assert [m.message_id for m in transport.receive("inbox")] == ["a"]
    assert [m.message_id for m in transport.receive("other")] == ["b"]


def test_a_bad_id_is_refused_before_anything_changes(transport):
    failed(transport, "inbox", message_id="a")
    errors = ErrorQueue(transport)
    good = errors.list()[0].id
    with pytest.raises(ConfigurationError, match="'not-a-guid'"):
        errors.retry([good, "not-a-guid"])
    with pytest.raises(ConfigurationError, match="'x'"):
        errors.get("x")
    assert errors.count() == 1


def test_a_poison_row_is_listed_raw_and_not_retried(transport):
    poison = uuid.uuid4()
    with transport.engine.begin() as connection:
        transport.queues.table_queue("error").send(
            connection, [PreparedMessage(poison, "p", "{not json", b"raw", None)]
        )
    errors = ErrorQueue(transport)
    [listed] = errors.list()
    assert listed.id == str(poison)
    assert listed.raw_headers == "{not json"
    assert listed.headers == {}
    assert listed.body == b"raw"
    assert errors.retry([str(poison)]) == 0  # names no queue: left where it is
    assert errors.count() == 1
    assert errors.delete([str(poison)]) == 1


def test_two_operators_retrying_together_send_each_message_once(transport):
    for number in range(20):
        failed(transport, "inbox", message_id=f"m{number}")
    errors = ErrorQueue(transport)
    ids = [each.id for each in errors.list()]
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(errors.retry(ids)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 20
    received = [m.message_id for m in transport.receive("inbox", 100)]
    assert sorted(received) == sorted(f"m{n}" for n in range(20))
    assert errors.count() == 0
