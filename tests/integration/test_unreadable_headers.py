"""A row whose headers cannot be read never blocks its queue; .NET's null header values read.

Each hostile row is inserted raw, with a good message behind it. Both are received in order: the
hostile one comes out with ``headers_error`` and its stored content unchanged, the good one as
sent, and the queue is empty afterwards. Every test runs on each receive path: the transport's
own short transaction (DBAPI cursor), the caller's connection, and SQLAlchemy's execution (taken
when the engine has cursor listeners).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, UnitOfWork, headers, queue_model
from sqlqueue_orm.models import queue_table
from sqlqueue_orm.sending.outbox import Outbox
from tests.conftest import only

PATHS = ("own", "connection", "listened")


def insert_raw(database, queue, raw_headers, body=b"hostile"):
    """Insert a row whose Headers hold *raw_headers* exactly (bytes: stored as TEXT, unchecked)."""
    model = queue_model(queue, dialect=database.engine)
    # PostgreSQL's NServiceBus layout has no Recoverable column; the SQL Server layout needs it.
    recoverable = {"recoverable": True} if "Recoverable" in model.__table__.c else {}
    value = raw_headers
    if isinstance(raw_headers, bytes):  # cast unchecked: SQLite TEXT, SQL Server nvarchar
        value = sa.cast(sa.literal(raw_headers, sa.LargeBinary()), queue_table.HEADERS_TYPE)
    with database.engine.begin() as connection:
        connection.execute(
            sa.insert(model).values(id=uuid.uuid4(), headers=value, body=body, **recoverable)
        )


def receive(database, transport, queue, path, max_messages=1):
    if path == "own":
        return transport.receive(queue, max_messages=max_messages)
    if path == "listened":
        sa.event.listen(database.engine, "before_cursor_execute", _listener)
        try:
            with database.engine.begin() as connection:
                return transport.receive(queue, max_messages=max_messages, connection=connection)
        finally:
            sa.event.remove(database.engine, "before_cursor_execute", _listener)
    with database.engine.begin() as connection:
        return transport.receive(queue, max_messages=max_messages, connection=connection)


def _listener(*args):
    return None


def assert_hostile_then_good(database, transport, queue, raw, why, path):
    good = transport.send(queue, OutgoingMessage(b"good", headers={"k": "v"}))
    first = receive(database, transport, queue, path)
    assert len(first) == 1
    [hostile] = first
    assert hostile.headers == {} and hostile.body == b"hostile"
    assert hostile.headers_error is not None and why in hostile.headers_error
    assert hostile.raw_headers == raw
    assert hostile.message_id == str(hostile.id)  # no header: the native id, as NServiceBus
    [second] = receive(database, transport, queue, path)
    assert second.headers_error is None and second.message_id == good
    assert second.headers["k"] == "v" and second.body == b"good"
    assert receive(database, transport, queue, path, max_messages=10) == []
    assert transport.peek(queue) == 0


@pytest.mark.parametrize("path", PATHS)
def test_headers_nested_past_the_recursion_limit_do_not_block(database, path):
    transport = database.transport()
    transport.create_queue("deep")
    raw = "[" * 100_000
    insert_raw(database, "deep", raw)
    assert_hostile_then_good(database, transport, "deep", raw, "nested too deeply", path)


@pytest.mark.parametrize("path", PATHS)
def test_deeply_nested_object_value_does_not_block(database, path):
    transport = database.transport()
    transport.create_queue("deep-object")
    raw = '{"a":' * 50_000 + '"x"' + "}" * 50_000
    insert_raw(database, "deep-object", raw)
    assert_hostile_then_good(database, transport, "deep-object", raw, "nested too deeply", path)


@only("sqlite", "mssql")
@pytest.mark.parametrize("path", PATHS)
def test_headers_the_driver_cannot_decode_do_not_block(database, path):
    transport = database.transport()
    transport.create_queue("undecodable")
    if database.dialect == "sqlite":  # Latin-1 bytes in a TEXT column
        raw, why = '{"NServiceBus.MessageId":"caf\xe9"}'.encode("latin-1"), "not valid UTF-8"
    else:  # an unpaired surrogate in nvarchar (UTF-16LE code units)
        raw = '{"a":"'.encode("utf-16-le") + b"\x00\xd8" + '"}'.encode("utf-16-le")
        why = "not valid UTF-16"
    insert_raw(database, "undecodable", raw)
    assert_hostile_then_good(database, transport, "undecodable", raw, why, path)


@only("sqlite", "mssql")
def test_browse_shows_headers_the_driver_cannot_decode_raw(database):
    transport = database.transport()
    transport.create_queue("undecodable")
    if database.dialect == "sqlite":
        raw = '{"NServiceBus.MessageId":"caf\xe9"}'.encode("latin-1")
    else:
        raw = '{"a":"'.encode("utf-16-le") + b"\x00\xd8" + '"}'.encode("utf-16-le")
    insert_raw(database, "undecodable", raw)
    transport.send("undecodable", OutgoingMessage(b"good"))
    hostile, good = transport.browse("undecodable")
    assert hostile.headers_error is not None and hostile.raw_headers == raw
    assert good.headers_error is None and good.body == b"good"
    assert len(transport.browse("undecodable")) == 2  # browsing took nothing


@only("postgresql")
def test_postgresql_text_cannot_hold_invalid_utf8(database):
    # Why the PostgreSQL receive reads Headers as text: a UTF8 database refuses the bytes that
    # make SQLite's driver fail, so every stored value decodes.
    database.transport().create_queue("latin1")
    with pytest.raises(sa.exc.DataError, match="UTF8"):
        insert_raw(database, "latin1", sa.func.convert_from(b'{"a":"caf\xe9"}', "UTF8"))


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{broken", "cannot be read"),
        ("[1,2]", "JSON array"),
        ("null", "JSON null"),
        ('{"a":{"b":"c"}}', "JSON object"),
        ('{"n":' + "9" * 5000 + "}", "cannot be read"),
        ('{"NServiceBus.ExceptionInfo.Message":"cut \\ud83d"}', "unpaired UTF-16 surrogate"),
    ],
    ids=["not-json", "array", "null", "nested-value", "huge-number", "unpaired-surrogate"],
)
def test_headers_that_are_not_an_object_of_strings_do_not_block(database, raw, why):
    transport = database.transport()
    transport.create_queue("odd")
    insert_raw(database, "odd", raw)
    assert_hostile_then_good(database, transport, "odd", raw, why, "own")


def test_a_batch_hands_out_hostile_and_good_rows_in_order(database):
    transport = database.transport()
    transport.create_queue("batch")
    transport.send(transport.queues.address("batch"), OutgoingMessage(b"0"))
    insert_raw(database, "batch", "[" * 100_000)
    transport.send("batch", OutgoingMessage(b"2"))
    messages = transport.receive("batch", max_messages=10)
    assert [message.body for message in messages] == [b"0", b"hostile", b"2"]
    assert [message.headers_error is None for message in messages] == [True, False, True]


# An error-queue message as NServiceBus writes it: header names from its ExceptionHeaderHelper
# (Particular/NServiceBus.SqlServer, commit 214c4e8f,
# src/NServiceBus.Transport.Sql.Shared/Receiving/ExceptionHeaderHelper.cs), which stores
# Exception.HelpLink (usually null) and Exception.Source as they are; the serializer's output
# format (null values, "\/", non-ASCII as itself, astral characters as \u surrogate pairs) from
# its DictionarySerializerTests approval files. The values are our own.
DOTNET_ERROR_HEADERS = (
    "{"
    '"NServiceBus.MessageId":"5b1f3a2c-9d7e-4a51-b0c2-b1a800f3c9d4",'
    '"NServiceBus.MessageIntent":"Send",'
    '"NServiceBus.ConversationId":"0c5d8f4e-2b7a-4e0f-9a3b-b1a800f3c9d5",'
    '"NServiceBus.CorrelationId":"5b1f3a2c-9d7e-4a51-b0c2-b1a800f3c9d4",'
    '"NServiceBus.ReplyToAddress":"Sales@[dbo]@[nservicebus]",'
    '"NServiceBus.OriginatingMachine":"BUILD-01",'
    '"NServiceBus.OriginatingEndpoint":"Sales",'
    '"$.diagnostics.originating.hostid":"3f6c4e1b0a9d8c7b6a5f4e3d2c1b0a99",'
    '"NServiceBus.ContentType":"application\\/json",'
    '"NServiceBus.EnclosedMessageTypes":"Sales.PlaceOrder, Sales.Messages, Version=1.0.0.0, '
    'Culture=neutral, PublicKeyToken=null",'
    '"NServiceBus.Version":"9.2.3",'
    '"NServiceBus.TimeSent":"2026-06-26 18:20:33:123456 Z",'
    '"NServiceBus.ProcessingStarted":"2026-06-26 18:20:33:223456 Z",'
    '"NServiceBus.ProcessingEnded":"2026-06-26 18:20:33:323456 Z",'
    '"NServiceBus.ProcessingEndpoint":"Billing",'
    '"NServiceBus.ProcessingMachine":"BUILD-02",'
    '"NServiceBus.FailedQ":"Billing@[dbo]@[nservicebus]",'
    '"NServiceBus.ExceptionInfo.ExceptionType":"System.InvalidOperationException",'
    '"NServiceBus.ExceptionInfo.InnerExceptionType":"System.Collections.Generic.KeyNotFoundException",'
    '"NServiceBus.ExceptionInfo.HelpLink":null,'
    '"NServiceBus.ExceptionInfo.Message":"Kunde \\"Müller\\" nicht gefunden \\uD83D\\uDE80",'
    '"NServiceBus.ExceptionInfo.Source":"Billing",'
    '"NServiceBus.ExceptionInfo.StackTrace":"System.InvalidOperationException: Kunde\\r\\n'
    '   at Billing.Handler.Handle(PlaceOrder message) in C:\\\\src\\\\Billing\\\\Handler.cs:'
    'line 42",'
    '"NServiceBus.ExceptionInfo.Data.OrderId":"17",'
    '"NServiceBus.TimeOfFailure":"2026-06-26 18:20:33:423456 Z",'
    '"NServiceBus.Retries":"3"'
    "}"
)


@pytest.mark.parametrize("path", PATHS)
def test_dotnet_error_queue_message_with_null_headers_reads_cleanly(database, path):
    transport = database.transport()
    transport.create_queue("error")
    insert_raw(database, "error", DOTNET_ERROR_HEADERS, body=b'{"OrderId":17}')
    [message] = receive(database, transport, "error", path)
    assert message.headers_error is None
    assert message.raw_headers == DOTNET_ERROR_HEADERS
    assert message.headers == json.loads(DOTNET_ERROR_HEADERS)
    assert message.headers[headers.EXCEPTION_HELP_LINK] is None
    assert message.headers[headers.EXCEPTION_MESSAGE] == 'Kunde "Müller" nicht gefunden 🚀'
    assert message.headers[headers.CONTENT_TYPE] == "application/json"
    assert message.message_id == "5b1f3a2c-9d7e-4a51-b0c2-b1a800f3c9d4"


def stored_headers(database, queue):
    model = queue_model(queue, dialect=database.engine)
    with database.engine.connect() as connection:
        return connection.execute(sa.select(model.headers)).scalar_one()


def test_null_header_values_are_forwarded_as_null(database):
    transport = database.transport()
    transport.create_queues(["error", "audit"])
    insert_raw(database, "error", DOTNET_ERROR_HEADERS)
    [message] = transport.receive("error")
    transport.send("audit", message.to_outgoing())
    text = stored_headers(database, "audit")
    assert '"NServiceBus.ExceptionInfo.HelpLink":null' in text
    assert json.loads(text) == message.headers
    [forwarded] = transport.receive("audit")
    assert forwarded.headers_error is None and forwarded.headers == message.headers


@pytest.mark.parametrize("mode", ["direct", "outbox"])
def test_null_header_values_survive_a_unit_of_work(database, mode):
    transport = database.transport()
    transport.create_queues(["error", "retry"])
    Outbox(transport).create_table()
    insert_raw(database, "error", DOTNET_ERROR_HEADERS)
    [message] = transport.receive("error")
    with UnitOfWork(transport, mode=mode) as unit:
        unit.send("retry", message.to_outgoing())
    [forwarded] = transport.receive("retry")
    assert forwarded.headers_error is None
    assert forwarded.headers[headers.EXCEPTION_HELP_LINK] is None
    assert forwarded.headers == message.headers


@only("sqlite")
def test_cli_receive_json_prints_undecodable_headers_as_base64(database):
    transport = database.transport()
    transport.create_queue("cli")
    raw = b'{"a":"caf\xe9"}'
    insert_raw(database, "cli", raw)
    insert_raw(database, "cli", "[" * 100_000)
    done = subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", "receive", "cli", "--count", "5", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SQLQUEUE_URL": database.url},
        timeout=120,
    )
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["headers"] is None and base64.b64decode(first["headers_base64"]) == raw
    assert "not valid UTF-8" in first["headers_error"]
    assert second["headers"] == "[" * 100_000 and "nested too deeply" in second["headers_error"]
    assert transport.peek("cli") == 0
