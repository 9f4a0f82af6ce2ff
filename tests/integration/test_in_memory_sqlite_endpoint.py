"""An endpoint refuses an in-memory SQLite database at start, naming the URL.

An in-memory SQLite database is its connection's own: the endpoint's pump threads (or asyncio
tasks), its delayed mover and its health writer each use a connection of their own, which would
open new, empty databases and find no queue there, for ever. A transport used on one thread
keeps working on it (``test_hot_path_caches``); only the endpoint is refused.
"""

from __future__ import annotations

import asyncio

import pytest

from sqlqueue_orm import Endpoint, OutgoingMessage, Transport, exceptions
from sqlqueue_orm.aio import AsyncEndpoint, AsyncTransport


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_endpoint_on_an_in_memory_sqlite_database_is_refused_at_start(url: str) -> None:
    transport = Transport(url)
    try:
        transport.create_queue("orders")
        transport.send("orders", OutgoingMessage(b"kept"))
        endpoint = Endpoint("orders", transport)
        endpoint.handle_raw(lambda body, context: None)
        with pytest.raises(exceptions.ConfigurationError) as raised:
            endpoint.start()
        assert url in str(raised.value)
        assert "in-memory" in str(raised.value)
        # nothing taken: the message waits for a receive on the transport's own connection
        assert [message.body for message in transport.receive("orders")] == [b"kept"]
    finally:
        transport.engine.dispose()


def test_an_async_endpoint_on_an_in_memory_sqlite_database_is_refused_at_start() -> None:
    async def scenario() -> None:
        transport = AsyncTransport("sqlite+aiosqlite://")
        try:
            await transport.create_queue("orders")
            await transport.send("orders", OutgoingMessage(b"kept"))
            endpoint = AsyncEndpoint("orders", transport)

            @endpoint.handle_raw
            async def handle(body: bytes, context: object) -> None:
                pass

            with pytest.raises(exceptions.ConfigurationError) as raised:
                await endpoint.start()
            assert "sqlite+aiosqlite://" in str(raised.value)
            assert [message.body for message in await transport.receive("orders")] == [b"kept"]
        finally:
            await transport.close()

    asyncio.run(scenario())
