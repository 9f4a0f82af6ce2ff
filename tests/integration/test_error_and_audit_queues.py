"""Failed, poison and processed messages: what reaches the error and audit queues, byte for byte.

A message that always fails lands in the error queue with NServiceBus's failure headers (names,
null HelpLink and time format as .NET writes them) and its body unchanged, while the messages
behind it are handled; each poison kind goes there at once, without retries, as it was stored;
a retried error message is handled; audit copies carry the processing headers.
"""

from __future__ import annotations

import datetime as dt
import socket
import uuid

import pydantic
import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, headers, queue_model
from sqlqueue_orm.models import queue_table
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.recoverability import ErrorQueue
from tests.endpoint_app import Job
from tests.integration.test_endpoint_transaction_modes import run_until

BODY = bytes(range(256)) * 2  # every byte value: not JSON, not UTF-8
MODES = [TransactionMode.TRANSACTION_SCOPE, TransactionMode.NONE]


class Rejected(Exception):
    """The handler's failure (raised from a KeyError, so it has an inner exception)."""


class Strict(pydantic.BaseModel):
    """A model the poison body does not fit."""

    number: int


def settings(mode: TransactionMode, **changes: object) -> EndpointSettings:
    values: dict[str, object] = {"concurrency": 1, "transaction_mode": mode,
                                 "peek_delay": 0.1, "immediate_retries": 2, "delayed_retries": 0,
                                 **changes}
    return EndpointSettings(**values)  # type: ignore[arg-type]


def processed(endpoint: Endpoint, count: int):  # type: ignore[no-untyped-def]
    def done() -> bool:
        stats = endpoint.stats
        return stats.handled + stats.failed + stats.poison >= count

    return done


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_message_that_always_fails_reaches_the_error_queue_as_dotnet_writes_it(database, mode):
    transport = database.transport()
    transport.create_queue("inbox")
    sent_headers = {"Custom": "kept \u00e9/\u2603", "NServiceBus.ContentType": None}
    transport.send("inbox", OutgoingMessage(BODY, message_id="bad", headers=sent_headers))
    good = [transport.send("inbox", OutgoingMessage(b"good")) for _ in range(3)]
    endpoint = Endpoint("inbox", transport, settings=settings(mode))
    handled: list[str] = []

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        if context.message_id == "bad":
            try:
                {}["missing"]
            except KeyError as error:
                raise Rejected("order 17 rejected") from error
        handled.append(context.message_id)

    before = dt.datetime.now(dt.UTC)
    run_until(endpoint, processed(endpoint, 4))
    assert handled == good  # the failing message blocked nothing
    assert endpoint.stats.retried == (2 if mode is not TransactionMode.NONE else 0)
    [moved] = transport.receive("error", 10)
    assert moved.body == BODY
    found = moved.headers
    assert found[headers.MESSAGE_ID] == "bad"
    assert found["Custom"] == sent_headers["Custom"]
    assert found["NServiceBus.ContentType"] is None
    assert found[headers.FAILED_QUEUE] == transport.address_text("inbox")
    assert found[headers.EXCEPTION_TYPE] == f"{__name__}.Rejected"
    assert found[headers.EXCEPTION_INNER_TYPE] == "builtins.KeyError"
    assert found[headers.EXCEPTION_MESSAGE] == "order 17 rejected"
    assert found[headers.EXCEPTION_SOURCE] == __name__
    trace = found[headers.EXCEPTION_STACK_TRACE]
    assert trace is not None and trace.startswith("Traceback (most recent call last):")
    assert trace.rstrip().endswith("Rejected: order 17 rejected")
    assert found[headers.PROCESSING_ENDPOINT] == "inbox"
    assert found[headers.PROCESSING_MACHINE] == socket.gethostname()
    failed_at = headers.parse_time(found[headers.TIME_OF_FAILURE] or "")
    assert before <= failed_at <= dt.datetime.now(dt.UTC)
    # The wire form .NET writes: HelpLink present as JSON null, "/" as "\/"
    assert isinstance(moved.raw_headers, str)
    assert '"NServiceBus.ExceptionInfo.HelpLink":null' in moved.raw_headers
    assert '"Custom":"kept \u00e9\\/\u2603"' in moved.raw_headers


def insert_raw(database, queue, native_id, raw_headers, body):  # type: ignore[no-untyped-def]
    """A row whose Headers hold *raw_headers* exactly (bytes: cast unchecked into TEXT)."""
    model = queue_model(queue, dialect=database.engine)
    recoverable = {"recoverable": True} if "Recoverable" in model.__table__.c else {}
    value = raw_headers
    if isinstance(raw_headers, bytes):
        value = sa.cast(sa.literal(raw_headers, sa.LargeBinary()), queue_table.HEADERS_TYPE)
    with database.engine.begin() as connection:
        connection.execute(
            sa.insert(model).values(id=native_id, headers=value, body=body, **recoverable)
        )


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_each_poison_kind_reaches_the_error_queue_at_once_and_intact(database, mode):
    transport = database.transport()
    transport.create_queue("inbox")
    if database.dialect == "sqlite":  # Latin-1 bytes: not UTF-8, kept as the very bytes
        unreadable: str | bytes = '{"NServiceBus.MessageId":"caf\xe9"}'.encode("latin-1")
    else:
        # PostgreSQL: a UTF8 database refuses bytes that are not UTF-8 on the way in
        # (test_unreadable_headers), so no such row can exist; the text nobody can read
        # there is an escaped unpaired surrogate, kept as stored.
        unreadable = '{"NServiceBus.MessageId":"caf\u00e9 \\ud83d"}'
    raw_rows = {
        uuid.uuid4(): ("{not json \u00e9", b"not json"),
        uuid.uuid4(): ('{"NServiceBus.MessageId":"x","nested":{"a":"b"}}', b"nested"),
        uuid.uuid4(): (unreadable, BODY),
    }
    for native_id, (raw, body) in raw_rows.items():
        insert_raw(database, "inbox", native_id, raw, body)
    transport.send("inbox", OutgoingMessage(b"\xff{not json", message_id="bad-body",
                                            headers={headers.ENCLOSED_MESSAGE_TYPES: "Strict"}))
    transport.send("inbox", OutgoingMessage(b"?", message_id="unknown-type", headers={
        headers.ENCLOSED_MESSAGE_TYPES: "Nobody.Handles.This, Nobody"}))
    good = [transport.send("inbox", OutgoingMessage(Job(number=n))) for n in range(3)]
    endpoint = Endpoint("inbox", transport, settings=settings(mode, immediate_retries=5))
    handled: list[str] = []

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        handled.append(context.message_id)

    @endpoint.handle(Strict, type_name="Strict")
    def never(strict: Strict, context: HandlerContext) -> None:
        raise AssertionError("the body does not fit the model")

    run_until(endpoint, processed(endpoint, 8))
    assert handled == good
    assert endpoint.stats.retried == 0  # none of them could pass on a retry
    assert (endpoint.stats.poison, endpoint.stats.failed) == (3, 2)
    moved = {message.id: message for message in transport.receive("error", 10)}
    for native_id, (raw, body) in raw_rows.items():
        row = moved.pop(native_id)  # the same native Id, as NServiceBus's DeadLetter
        assert row.raw_headers == raw  # byte for byte, nothing added
        assert row.body == body
    by_message = {message.message_id: message for message in moved.values()}
    assert set(by_message) == {"bad-body", "unknown-type"}
    assert by_message["bad-body"].body == b"\xff{not json"
    assert by_message["bad-body"].headers[headers.EXCEPTION_TYPE] == (
        "pydantic_core._pydantic_core.ValidationError"
    )
    assert by_message["unknown-type"].headers[headers.EXCEPTION_TYPE] == (
        "sqlqueue_orm.exceptions.UnknownMessageType"
    )


def test_a_retried_error_message_is_handled(database):
    transport = database.transport()
    transport.create_queue("inbox")
    message_id = transport.send("inbox", OutgoingMessage(Job(number=7)))
    endpoint = Endpoint("inbox", transport,
                        settings=settings(TransactionMode.TRANSACTION_SCOPE, immediate_retries=0))
    handled: list[int] = []
    broken = [True]

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        if broken[0]:
            raise RuntimeError("database of record is down")
        handled.append(job.number)

    run_until(endpoint, lambda: endpoint.stats.failed == 1)
    errors = ErrorQueue(transport)
    [failed] = errors.list()
    assert failed.message_id == message_id
    assert failed.exception_message == "database of record is down"
    broken[0] = False  # the fix is deployed
    assert errors.retry([failed.id]) == 1
    run_until(endpoint, lambda: endpoint.stats.handled == 1)
    assert handled == [7]
    assert errors.count() == 0


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_audit_copies_carry_the_processing_headers(database, mode):
    transport = database.transport()
    transport.create_queue("inbox")
    sent = [transport.send("inbox", OutgoingMessage(BODY, headers={"Custom": "x"}))
            for _ in range(3)]
    failing = transport.send("inbox", OutgoingMessage(b"fail"))
    endpoint = Endpoint("inbox", transport, settings=settings(mode, audit_queue="audit"))

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        if body == b"fail":
            raise ValueError("not audited")

    before = dt.datetime.now(dt.UTC)
    run_until(endpoint, processed(endpoint, 4))
    after = dt.datetime.now(dt.UTC)
    audited = transport.receive("audit", 10)
    assert [message.message_id for message in audited] == sent  # the failed one is not copied
    for message in audited:
        assert message.body == BODY
        assert message.headers["Custom"] == "x"
        started = headers.parse_time(message.headers[headers.PROCESSING_STARTED] or "")
        ended = headers.parse_time(message.headers[headers.PROCESSING_ENDED] or "")
        assert before <= started <= ended <= after
        assert message.headers[headers.PROCESSING_ENDPOINT] == "inbox"
        assert message.headers[headers.PROCESSING_MACHINE] == socket.gethostname()
    [failed] = transport.receive("error", 10)
    assert failed.message_id == failing

