"""PostgreSQL addresses are written ``"schema"."table"``, as the .NET PostgreSQL transport does.

.NET's publisher reads ``SubscriptionRouting.QueueAddress`` with ``GetSubscribersText`` and sends
to that text; ServiceControl compares ``NServiceBus.FailedQ`` with the queues it knows. Both hold
the qualified form (``"public"."sales"``), so a queue named without a schema is written in the
connection's current schema. The literals below are what .NET writes, not what our own code
returns. Both spellings are still read as one queue. SQL Server and SQLite addresses
(``table@[schema]@[catalog]``) do not change.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, QueueAddress, Transport, db, headers
from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.recoverability import ErrorQueue
from tests.conftest import only
from tests.integration.test_publish_subscribe import DOTNET_GET_SUBSCRIBERS, OrderPlaced

#: What a .NET PostgreSQL endpoint "sales" in the default schema writes as its address.
DOTNET_SALES = '"public"."sales"'


def test_a_transport_made_from_a_url_writes_the_schema(database):
    """Before any connection was made, too: the current schema is asked for once."""
    with Transport(database.url) as transport:
        written = transport.address_text("sales")
        other = transport.address_text(QueueAddress("sales", "nsb"))
        bracketed = transport.address_text("sales@[nsb]")
    if database.dialect == "postgresql":
        assert (written, other, bracketed) == (DOTNET_SALES, '"nsb"."sales"', '"nsb"."sales"')
    else:  # the SQL Server form, unchanged
        assert (written, other, bracketed) == ("sales", "sales@[nsb]", "sales@[nsb]")


@only("postgresql")
def test_the_schema_written_is_the_connections_current_schema(database):
    with database.engine.begin() as connection:
        connection.exec_driver_sql('CREATE SCHEMA "App"')
    engine = db.create_engine(database.url, connect_args={"options": '-c search_path="App"'})
    try:
        with Transport(engine) as transport:
            assert transport.address_text("sales") == '"App"."sales"'
            transport.create_queue("sales")
            transport.send('"App"."sales"', OutgoingMessage(b"one queue"))
            assert [m.body for m in transport.receive("sales")] == [b"one queue"]
    finally:
        engine.dispose()


@only("postgresql")
def test_headers_and_subscriptions_carry_the_qualified_address(database):
    transport = database.transport()
    for queue in ("sales", "billing", "error"):
        transport.create_queue(queue)
    transport.create_subscription_table()
    settings = EndpointSettings(concurrency=1, transaction_mode=TransactionMode.TRANSACTION_SCOPE,
                                peek_delay=0.1, immediate_retries=0, delayed_retries=0)
    endpoint = Endpoint("sales", transport, settings=settings)
    endpoint.map_type(OrderPlaced, "Shop.Events.OrderPlaced")

    @endpoint.handle_raw
    def fail(body: bytes, context: HandlerContext) -> None:
        raise RuntimeError("declined")

    # SubscriptionRouting, read with NServiceBus's own GetSubscribersText.
    endpoint.subscribe(OrderPlaced)
    statement = DOTNET_GET_SUBSCRIBERS.format('"public"."SubscriptionRouting"', ":Topic_0")
    with transport.engine.connect() as connection:
        rows = connection.execute(sa.text(statement), {"Topic_0": "Shop.Events.OrderPlaced"})
        assert [row[0] for row in rows] == [DOTNET_SALES]

    # ReplyToAddress of a send; the forwarding destination of a delayed send.
    endpoint.send("billing", OutgoingMessage(b"invoice"))
    [sent] = transport.receive("billing")
    assert sent.headers[headers.REPLY_TO_ADDRESS] == DOTNET_SALES
    transport.create_delayed_table("sales")
    transport.send("billing", OutgoingMessage(b"later"), delay=3600, endpoint="sales")
    [waiting] = transport.browse_delayed("sales")
    assert waiting.headers[FORWARD_DESTINATION] == '"public"."billing"'

    # FailedQ of a message that failed.
    transport.send("sales", OutgoingMessage(b"to fail"))
    endpoint.start()
    try:
        deadline = time.monotonic() + 30
        while transport.peek("error") == 0:
            assert time.monotonic() < deadline, endpoint.stats
            time.sleep(0.05)
    finally:
        assert endpoint.stop(10)
    [failed] = transport.browse("error")
    assert failed.headers[headers.FAILED_QUEUE] == DOTNET_SALES


@only("postgresql")
def test_both_spellings_of_a_failed_queue_are_retried_to_one_queue(database):
    transport = database.transport()
    transport.create_queue("sales")
    transport.create_queue("error")
    for spelling in (DOTNET_SALES, '"sales"', "sales"):
        transport.send("error", OutgoingMessage(spelling.encode(), headers={
            headers.FAILED_QUEUE: spelling}))
    errors = ErrorQueue(transport, "error")
    assert len(errors.retryable_ids("sales")) == 3
    assert len(errors.retryable_ids(DOTNET_SALES)) == 3
    assert errors.retry_all("sales") == 3
    assert sorted(m.body for m in transport.receive("sales", 10)) == sorted(
        s.encode() for s in (DOTNET_SALES, '"sales"', "sales"))
