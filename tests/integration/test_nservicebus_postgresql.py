"""Interop with NServiceBus's PostgreSQL transport: its statements and ours share one queue table.

Interop test vectors: the statements below are what the .NET transport runs, as written in
``src/NServiceBus.Transport.PostgreSql/PostgreSqlConstants.cs`` of Particular/NServiceBus.SqlServer
at commit 214c4e8f06175186e356677546ea2d8e0f2b0c55 (``CreateQueueText``, ``SendText``,
``ReceiveText``, ``PeekText``, ``PurgeText``). Only two things are changed: ``{0}`` becomes the
queue's quoted name (the .NET transport's ``"schema"."table"`` address) and ``@Name`` parameters
become psycopg's ``%(Name)s``. Every test runs them on a real PostgreSQL server next to our
:class:`~sqlqueue_orm.Transport`, in both directions, and checks FIFO order, headers and bodies
byte for byte, and TTBR expiry.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, QueueAddress, Transport, headers, queue_model
from sqlqueue_orm.queuing import sql
from tests.conftest import only

# -- NServiceBus.Transport.PostgreSql PostgreSqlConstants.cs @ 214c4e8f (see the module docstring)
NSB_CREATE_QUEUE = """
CREATE TABLE IF NOT EXISTS {0} (
    Id uuid NOT NULL PRIMARY KEY,
    Expires TIMESTAMP,
    Headers TEXT NOT NULL,
    Body BYTEA,
    Seq serial NOT NULL UNIQUE
);
"""
NSB_SEND = """
INSERT INTO {0} (
    Id,
    Expires,
    Headers,
    Body)
VALUES (
    %(Id)s,
    (now() AT TIME ZONE 'UTC') + (%(TimeToBeReceivedMs)s || ' ms')::INTERVAL,
    %(Headers)s,
    %(Body)s);"""
NSB_RECEIVE = """
DELETE FROM {0} rs
WHERE rs.id = (SELECT id FROM {0} ORDER BY Seq LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING rs.id,
        CASE WHEN Expires IS NULL
        THEN 0
        WHEN Expires > now() AT TIME ZONE 'UTC' THEN 0 ELSE 1
        END Expired,
        rs.Headers, rs.Body;
"""
NSB_PEEK = """
SELECT COALESCE(cast((SELECT seq FROM {0} ORDER BY seq DESC LIMIT 1 FOR UPDATE SKIP LOCKED)
- (SELECT seq FROM {0} ORDER BY seq ASC LIMIT 1 FOR UPDATE SKIP LOCKED) + 1 AS int), 0);"""
NSB_PURGE = "DELETE FROM {0}"
# -- end of the vectors

QUEUE = QueueAddress("Sales.Orders", "nsb")  # a .NET address: "nsb"."Sales.Orders"


class DotNetEndpoint:
    """Runs the .NET transport's statements on our engine, each in its own transaction."""

    def __init__(self, engine: sa.Engine, address: QueueAddress) -> None:
        self.engine = engine
        self.table = sql.format_table(engine.dialect, address)

    def _run(self, template: str, params: dict[str, Any] | None = None) -> Any:
        with self.engine.begin() as connection:
            result = connection.exec_driver_sql(template.format(self.table), params or {})
            return result.fetchall() if result.returns_rows else None

    def create_queue(self) -> None:
        with self.engine.begin() as connection:
            connection.exec_driver_sql('CREATE SCHEMA IF NOT EXISTS "nsb"')
        self._run(NSB_CREATE_QUEUE)

    def send(self, body: bytes | None, message_headers: dict[str, str],
             ttbr_ms: int | None = None) -> str:
        """Send as ``MessageRow.From``/``PrepareSendCommand`` do: a new Guid as the native id."""
        message_id = str(uuid.uuid4())
        wire = headers.serialize({headers.MESSAGE_ID: message_id, **message_headers})
        self._run(NSB_SEND, {"Id": uuid.uuid4(), "TimeToBeReceivedMs": ttbr_ms, "Headers": wire,
                             "Body": body})
        return message_id

    def receive(self) -> tuple[uuid.UUID, int, str, bytes | None] | None:
        rows = self._run(NSB_RECEIVE)
        if not rows:
            return None
        native_id, expired, raw_headers, body = rows[0]
        return native_id, int(expired), raw_headers, None if body is None else bytes(body)

    def receive_all(self) -> list[tuple[uuid.UUID, int, str, bytes | None]]:
        out = []
        while (row := self.receive()) is not None:
            out.append(row)
        return out

    def peek(self) -> int:
        return int(self._run(NSB_PEEK)[0][0])

    def purge(self) -> None:
        self._run(NSB_PURGE)


@pytest.fixture
def dotnet(database: Any) -> DotNetEndpoint:
    return DotNetEndpoint(database.engine, QUEUE)


def _drain(transport: Transport) -> list[Any]:
    received = []
    while batch := transport.receive(QUEUE, max_messages=2):
        received += batch
    return received


BODIES = [b'{"OrderId":1}', b"", None, bytes(range(256)), "Zürich ✓ 東京".encode()]
HEADERS = {
    headers.ENCLOSED_MESSAGE_TYPES: "Shop.PlaceOrder, Shop, Version=1.0.0.0",
    headers.CONTENT_TYPE: "application/json",
    "NServiceBus.ReplyToAddress": '"nsb"."Sales.Orders"',
    "Note": "naïve café \\/ “quoted”",
}


def _columns(engine: sa.Engine, address: QueueAddress) -> list[tuple[str, str, bool]]:
    with engine.connect() as connection:
        return [
            (str(name), str(kind), bool(not_null))
            for name, kind, not_null in connection.execute(
                sa.text(
                    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull "
                    "FROM pg_attribute AS a WHERE a.attrelid = to_regclass(:t) AND a.attnum > 0 "
                    "AND NOT a.attisdropped ORDER BY a.attnum"
                ),
                {"t": sql.format_table(engine.dialect, address)},
            )
        ]


def _constraints(engine: sa.Engine, address: QueueAddress) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return sorted(
            (str(kind), str(definition))
            for kind, definition in connection.execute(
                sa.text(
                    "SELECT contype, pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = to_regclass(:t)"
                ),
                {"t": sql.format_table(engine.dialect, address)},
            )
        )


@only("postgresql")
def test_our_table_has_the_dotnet_transports_columns_and_keys(database: Any,
                                                              dotnet: DotNetEndpoint) -> None:
    theirs = QueueAddress("theirs", "nsb")
    DotNetEndpoint(database.engine, theirs).create_queue()
    database.transport().create_queue(QUEUE)
    ours, created = _columns(database.engine, QUEUE), _columns(database.engine, theirs)
    # The one difference: seq is a bigint identity here, a serial (integer) there.
    assert [c for c in ours if c[0] != "seq"] == [c for c in created if c[0] != "seq"]
    assert ("seq", "bigint", True) in ours and ("seq", "integer", True) in created
    assert [c[0] for c in ours] == ["id", "expires", "headers", "body", "seq"]
    assert _constraints(database.engine, QUEUE) == _constraints(database.engine, theirs) == [
        ("p", "PRIMARY KEY (id)"),
        ("u", "UNIQUE (seq)"),
    ]


@only("postgresql")
def test_their_table_serves_our_send_receive_peek_and_purge(database: Any,
                                                             dotnet: DotNetEndpoint) -> None:
    dotnet.create_queue()
    transport = database.transport()
    sent = [transport.send(QUEUE, OutgoingMessage(body, headers=HEADERS)) for body in BODIES]
    assert transport.peek(QUEUE) == len(BODIES) == dotnet.peek()
    received = _drain(transport)
    assert [m.message_id for m in received] == sent
    assert [m.body for m in received] == BODIES
    assert all(m.headers[k] == v for m in received for k, v in HEADERS.items())
    assert not any(m.expired or m.headers_error for m in received)
    transport.send(QUEUE, OutgoingMessage(b"to purge"))
    assert transport.purge_all(QUEUE) == 1 and dotnet.peek() == 0


@only("postgresql")
def test_our_table_serves_their_send_receive_peek_and_purge(database: Any,
                                                             dotnet: DotNetEndpoint) -> None:
    database.transport().create_queue(QUEUE)
    dotnet.create_queue()  # CREATE TABLE IF NOT EXISTS: our table stays as it is
    sent = [dotnet.send(body, HEADERS) for body in BODIES]
    assert dotnet.peek() == len(BODIES)
    received = dotnet.receive_all()
    assert [headers.deserialize(row[2])[headers.MESSAGE_ID] for row in received] == sent
    assert [row[3] for row in received] == BODIES
    assert [row[1] for row in received] == [0] * len(BODIES)
    assert all(headers.deserialize(row[2])[k] == v for row in received for k, v in HEADERS.items())
    dotnet.send(b"to purge", HEADERS)
    dotnet.purge()
    assert database.transport().peek(QUEUE) == 0


@only("postgresql")
@pytest.mark.parametrize("created_by", ["us", "them"])
def test_their_send_our_receive_and_our_send_their_receive_keep_one_fifo(
    database: Any, dotnet: DotNetEndpoint, created_by: str
) -> None:
    transport = database.transport()
    if created_by == "us":
        transport.create_queue(QUEUE)
    else:
        dotnet.create_queue()
    order: list[tuple[str, str]] = []
    for number in range(6):  # interleaved: .NET, us, .NET, us, ...
        body = f"m{number}".encode()
        if number % 2 == 0:
            order.append(("dotnet", dotnet.send(body, {"n": str(number), **HEADERS})))
        else:
            message = OutgoingMessage(body, headers={"n": str(number), **HEADERS})
            order.append(("us", transport.send(QUEUE, message)))
    # We receive the first half, they receive the rest: one FIFO across both sides.
    ours = transport.receive(QUEUE, max_messages=3)
    theirs = dotnet.receive_all()
    assert [m.headers["n"] for m in ours] == ["0", "1", "2"]
    assert [headers.deserialize(row[2])["n"] for row in theirs] == ["3", "4", "5"]
    assert [m.body for m in ours] + [row[3] for row in theirs] == [
        f"m{n}".encode() for n in range(6)
    ]
    # Message ids cross over in the headers, both ways.
    assert [m.message_id for m in ours] == [mid for _, mid in order[:3]]
    assert [headers.deserialize(row[2])[headers.MESSAGE_ID] for row in theirs] == [
        mid for _, mid in order[3:]
    ]


@only("postgresql")
def test_ttbr_expiry_is_read_the_same_on_both_sides(database: Any,
                                                    dotnet: DotNetEndpoint) -> None:
    transport = database.transport()
    transport.create_queue(QUEUE)
    dotnet.send(b"their short", HEADERS, ttbr_ms=1)
    dotnet.send(b"their long", HEADERS, ttbr_ms=3_600_000)
    transport.send(QUEUE, OutgoingMessage(b"our short", time_to_be_received=0.001))
    transport.send(QUEUE, OutgoingMessage(b"our forever"))
    time.sleep(0.05)
    mine = transport.receive(QUEUE, max_messages=2)
    assert [(m.body, m.expired) for m in mine] == [(b"their short", True), (b"their long", False)]
    theirs = dotnet.receive_all()
    assert [(row[3], row[1]) for row in theirs] == [(b"our short", 1), (b"our forever", 0)]


@only("postgresql")
def test_the_orm_model_keeps_its_attributes_on_their_table(database: Any,
                                                           dotnet: DotNetEndpoint) -> None:
    from sqlalchemy.orm import Session

    dotnet.create_queue()
    dotnet.send(b"via the orm", HEADERS)
    model = queue_model(QUEUE.table, QUEUE.schema, database.engine)
    with Session(database.engine) as session:
        [row] = session.scalars(sa.select(model).order_by(model.row_version)).all()
    assert row.body == b"via the orm" and row.expires is None and row.row_version == 1
    assert row.recoverable is True and row.correlation_id is None and row.reply_to_address is None


@only("postgresql")
def test_a_message_sent_again_under_its_id_is_queued_once(database: Any,
                                                          dotnet: DotNetEndpoint, caplog) -> None:
    transport = database.transport()
    transport.create_queue(QUEUE)
    message = OutgoingMessage(b"once", headers=HEADERS)
    transport.send(QUEUE, message)
    transport.send_many(QUEUE, [message, OutgoingMessage(b"other")])  # a retried dispatch
    assert [row[3] for row in dotnet.receive_all()] == [b"once", b"other"]
    assert any(
        "already queued" in r.getMessage() and "Sales.Orders" in r.getMessage()
        for r in caplog.records
    )
