"""Replies reach the queue a ReplyToAddress names, in the address form of each .NET transport."""

from __future__ import annotations

import pytest

from sqlqueue_orm import ConfigurationError, OutgoingMessage, QueueAddress, headers
from tests.conftest import only


@only("postgresql")
def test_reply_reaches_a_dotnet_postgresql_schema_table_address(database):
    transport = database.transport()
    # A .NET PostgreSQL endpoint "Samples.Client" whose schema is "replies": it writes its
    # address as CanonicalQueueAddress.cs does, "schema"."table" (NServiceBus.SqlServer 214c4e8f).
    client = QueueAddress("Samples.Client", "replies")
    transport.create_queue(client)
    transport.create_queue("server")
    reply_to = '"replies"."Samples.Client"'
    transport.send(
        "server",
        OutgoingMessage(
            b"request",
            headers={headers.REPLY_TO_ADDRESS: reply_to, headers.CONVERSATION_ID: "conv-1"},
            message_id="request-1",
        ),
    )
    [request] = transport.receive("server")

    with transport.engine.begin() as connection:
        transport.reply(request, OutgoingMessage(b"response"), connection=connection)

    [response] = transport.receive(client)
    assert response.body == b"response"
    assert response.headers[headers.MESSAGE_INTENT] == "Reply"
    assert response.headers[headers.CORRELATION_ID] == "request-1"
    assert response.headers[headers.CONVERSATION_ID] == "conv-1"
    assert transport.peek("server") == 0
    # And the way back: the address we write is the one .NET reads.
    assert transport.address_text(client) == reply_to
    assert transport.queues.address(reply_to) == client


def test_reply_to_our_own_address_text(database):
    transport = database.transport()
    transport.create_queue("client")
    transport.create_queue("server")
    own = transport.address_text("client")
    expected = '"public"."client"' if database.dialect == "postgresql" else "client"
    assert own == expected
    transport.send("server", OutgoingMessage(b"ping", headers={headers.REPLY_TO_ADDRESS: own}))
    [request] = transport.receive("server")
    transport.reply(request, OutgoingMessage(b"pong", headers={headers.CORRELATION_ID: "mine"}))
    [response] = transport.receive("client")
    assert response.body == b"pong"
    assert response.headers[headers.CORRELATION_ID] == "mine"  # the message's own wins


def test_reply_without_reply_to_address_names_the_message(database):
    transport = database.transport()
    transport.create_queue("server")
    transport.send("server", OutgoingMessage(b"x", message_id="lonely"))
    [request] = transport.receive("server")
    with pytest.raises(ConfigurationError, match="lonely"):
        transport.reply(request, OutgoingMessage(b"y"))
