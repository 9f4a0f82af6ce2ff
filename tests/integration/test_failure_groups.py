"""Failure groups and search of an error queue, on SQLite and PostgreSQL.

Groups: by exception type and stack-trace fingerprint (line numbers, addresses and the message
text removed), by endpoint, by message type; .NET-written rows group too. A group retry sends
each of its messages back once, also with two operators at once. Search: by message id, header,
body text; pages reach the last row; "all that match" is exact and bounded.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from sqlqueue_orm import ConfigurationError, OutgoingMessage, headers
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.recoverability import ErrorQueue
from sqlqueue_orm.recoverability.groups import FailureGroups, group_id, stack_fingerprint
from sqlqueue_orm.recoverability.search import ErrorFilter, ErrorSearch


def python_trace(kind: str, text: str, line: int, address: str = "0x7f3a2c") -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "/srv/app-{line}/handlers.py", line {line}, in handle\n'
        "    process(order)\n"
        f'  File "/srv/app-{line}/orders.py", line {line + 7}, in process\n'
        f"    raise {kind}(f'{{order}}')\n"
        f"{kind}: {text} <Order object at {address}>\n"
    )


def fail(transport, message_id, *, kind="builtins.ValueError", text="boom", line=10,
         endpoint="inbox", message_type="Sales.PlaceOrder, Sales, Version=1.0.0.0",
         at="2026-01-02 03:04:05:000006 Z", body=b"{}", custom="kept"):
    """Put a message in the error queue as a Python endpoint moving it there would."""
    transport.send("error", OutgoingMessage(body, message_id=message_id, headers={
        headers.FAILED_QUEUE: transport.address_text(endpoint),
        headers.TIME_OF_FAILURE: at,
        headers.EXCEPTION_TYPE: kind,
        headers.EXCEPTION_MESSAGE: text,
        headers.EXCEPTION_HELP_LINK: None,
        headers.EXCEPTION_STACK_TRACE: python_trace(kind.rsplit(".")[-1], text, line),
        headers.PROCESSING_ENDPOINT: endpoint,
        headers.ENCLOSED_MESSAGE_TYPES: message_type,
        "Custom": custom,
    }))


def fail_dotnet(transport, message_id, *, order, line):
    """A row as a .NET endpoint writes it: compact JSON, ``\\/`` escapes, JSON nulls."""
    trace = (
        f"System.InvalidOperationException: Order {order} not found\r\n"
        f"   at Sales.PlaceOrderHandler.<Handle>d__{line}.MoveNext() in "
        f"C:\\build\\{order}\\Handler.cs:line {line}\r\n"
        "   at NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext context)"
    )
    found = {
        headers.MESSAGE_ID: message_id,
        headers.FAILED_QUEUE: transport.address_text("billing"),
        headers.TIME_OF_FAILURE: "2026-01-05 10:00:00:000000 Z",
        headers.EXCEPTION_TYPE: "System.InvalidOperationException",
        headers.EXCEPTION_MESSAGE: f"Order {order} not found",
        headers.EXCEPTION_HELP_LINK: None,
        headers.EXCEPTION_SOURCE: None,
        headers.EXCEPTION_STACK_TRACE: trace,
        headers.PROCESSING_ENDPOINT: "Billing",
        headers.ENCLOSED_MESSAGE_TYPES: "Billing.Charge, Billing, Version=2.0.0.0",
        "Url": "http://example/orders/1",
    }
    text = json.dumps(found, separators=(",", ":")).replace("/", "\\/")
    with transport.engine.begin() as connection:
        transport.queues.table_queue("error").send(
            connection, [PreparedMessage(uuid.uuid4(), message_id, text, b"dotnet", None)]
        )


@pytest.fixture
def transport(database):
    transport = database.transport()
    transport.create_queues(["error", "inbox", "other", "billing"])
    return transport


def test_fingerprint_drops_what_varies_and_keeps_where_it_failed():
    one = stack_fingerprint("builtins.ValueError", python_trace("ValueError", "order 1", 10))
    two = stack_fingerprint("builtins.ValueError",
                            python_trace("ValueError", "order 2", 99, "0xdeadbeef"))
    assert one == two
    assert one[1] == "builtins.ValueError: at orders.py:process"
    elsewhere = python_trace("ValueError", "x", 10).replace("in process", "in check")
    assert stack_fingerprint("builtins.ValueError", elsewhere)[0] != one[0]
    assert stack_fingerprint("builtins.KeyError", python_trace("KeyError", "x", 10))[0] != one[0]
    assert stack_fingerprint(None, None) == ("(none)", "(none)")


def test_groups_by_type_endpoint_and_message_type_with_dotnet_rows(transport):
    fail(transport, "a", text="order 1", line=10)
    fail(transport, "b", text="order 2", line=12, at="2026-01-03 00:00:00:000000 Z")
    fail(transport, "c", kind="Sales.OrderRejected", endpoint="other",
         message_type="Sales.Cancel")
    fail_dotnet(transport, "d", order=1, line=5)
    fail_dotnet(transport, "e", order=2, line=9)
    groups = FailureGroups(ErrorQueue(transport))

    by_type = groups.list()
    assert [(g.count, g.label) for g in by_type] == [
        (2, "System.InvalidOperationException: at Sales.PlaceOrderHandler.<Handle>d__.MoveNext()"),
        (2, "builtins.ValueError: at orders.py:process"),
        (1, "Sales.OrderRejected: at orders.py:process"),
    ]
    python = by_type[1]
    assert python.first_failure.isoformat() == "2026-01-02T03:04:05.000006+00:00"
    assert python.last_failure.isoformat() == "2026-01-03T00:00:00+00:00"
    assert [(g.label, g.count) for g in groups.list("endpoint")] == [
        ("Billing", 2), ("inbox", 2), ("other", 1)]
    assert [(g.label, g.count) for g in groups.list("message-type")] == [
        ("Billing.Charge", 2), ("Sales.PlaceOrder", 2), ("Sales.Cancel", 1)]
    assert groups.list("endpoint")[1].id == group_id("endpoint", "inbox")  # stable
    assert groups.get(python.id) == python
    ids = groups.ids(python.id)
    assert [ErrorQueue(transport).get(i).message_id for i in ids] == ["a", "b"]

    with pytest.raises(ConfigurationError, match="'nope'"):
        groups.ids("nope")
    with pytest.raises(ConfigurationError, match="'0000000000000000'"):
        groups.retry("0000000000000000")
    with pytest.raises(ConfigurationError, match="'sideways'"):
        groups.list("sideways")

    # A new message joins its group; a deleted one leaves it.
    fail(transport, "f", text="order 3", line=30)
    assert groups.list()[0].count == 3
    assert groups.delete(group_id("message-type", "Billing.Charge")) == 2  # the .NET ones
    assert [g.count for g in groups.list()] == [3, 1]
    assert ErrorQueue(transport).count() == 4


def test_two_operators_retrying_one_group_send_each_message_once(transport):
    for number in range(15):
        fail(transport, f"m{number}", text=f"order {number}", line=number)
    fail(transport, "other-group", kind="builtins.KeyError")
    groups = FailureGroups(ErrorQueue(transport))
    target = next(g for g in groups.list() if g.label.startswith("builtins.ValueError"))
    counts: list[int] = []
    errors: list[BaseException] = []

    def retry():
        try:
            counts.append(FailureGroups(ErrorQueue(transport)).retry(target.id))
        except ConfigurationError as error:  # the other one took the whole group first
            errors.append(error)

    threads = [threading.Thread(target=retry) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 15
    received = [m.message_id for m in transport.receive("inbox", 100)]
    assert sorted(received) == sorted(f"m{n}" for n in range(15))
    assert [m.message_id for m in ErrorQueue(transport).list()] == ["other-group"]
    assert [g.count for g in groups.list()] == [1]


def test_search_by_id_header_and_body_pages_to_the_last_row(transport):
    for number in range(23):
        fail(transport, f"m{number}", body=f"order {number} for ACME é".encode(),
             custom=f"c/{number % 5}")
    fail_dotnet(transport, "dotnet", order=7, line=1)
    errors = ErrorQueue(transport)
    search = ErrorSearch(errors)

    [found] = search.page(ErrorFilter(message_id="m7")).messages
    assert found.message_id == "m7"
    by_row_id = search.page(ErrorFilter(message_id=found.id.upper())).messages
    assert [m.message_id for m in by_row_id] == ["m7"]
    matched = search.page(ErrorFilter(header=("Custom", "c/3"))).messages
    assert [m.message_id for m in matched] == ["m3", "m8", "m13", "m18"]
    dotnet = search.page(ErrorFilter(header=("Url", "http://example/orders/1"))).messages
    assert [m.message_id for m in dotnet] == ["dotnet"]
    assert [m.message_id for m in search.page(ErrorFilter(text="order 12 ")).messages] == ["m12"]
    assert len(search.page(ErrorFilter(text="ACME é")).messages) == 23
    assert search.page(ErrorFilter(text="no such text")).messages == []

    seen, after, pages = [], None, 0
    while True:
        page = search.page(ErrorFilter(), after=after, limit=5)
        seen += [m.message_id for m in page.messages]
        pages += 1
        if page.next is None:
            break
        after = page.next
    assert seen == [f"m{n}" for n in range(23)] + ["dotnet"]
    assert pages == 5

    wanted = ErrorFilter(header=("Custom", "c/1"))
    ids = search.matching_ids(wanted, most=10)
    assert len(ids) == 5
    with pytest.raises(ConfigurationError, match="more than 4"):
        search.matching_ids(wanted, most=4)
    assert errors.retry(ids) == 5
    assert errors.retry(ids) == 0  # each once
    assert sorted(m.message_id for m in transport.receive("inbox", 100)) == [
        "m1", "m11", "m16", "m21", "m6"]
    group = FailureGroups(errors).list("endpoint")[0]
    assert len(search.page(ErrorFilter(group=group.id), limit=100).messages) == group.count
    with pytest.raises(ConfigurationError, match="'x1'"):
        search.page(ErrorFilter(), after="x1")


def test_fingerprint_drops_the_numbers_dotnet_gives_compiler_generated_classes():
    def trace(display_class, lambda_method, state_machine):
        return (
            "System.InvalidOperationException: Order 7 not found\n"
            f"   at Billing.Handler.<>c__{display_class}.<Handle>b__{lambda_method}() "
            "in C:\\src\\Handler.cs:line 42\n"
            f"   at Billing.Handler.<Handle>d__{state_machine}.MoveNext()\n"
        )

    exception = "System.InvalidOperationException"
    one = stack_fingerprint(exception, trace("DisplayClass12_0", "0", "5"))
    rebuilt = stack_fingerprint(exception, trace("DisplayClass14_2", "1", "7"))
    assert rebuilt == one
    assert "DisplayClass12" not in one[1] and "<>c__DisplayClass" in one[1]
    elsewhere = trace("DisplayClass12_0", "0", "5").replace("Billing.Handler", "Billing.Refund")
    assert stack_fingerprint(exception, elsewhere)[0] != one[0]
