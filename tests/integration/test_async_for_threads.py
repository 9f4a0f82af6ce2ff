"""AsyncTransport.for_threads: the synchronous transport of the same database, or a refusal.

The threads of an AsyncEndpoint (health beats, live control, the wake-up by other processes'
sends) read and write through it: it must reach the very database the async side uses, with
the async URL's settings the synchronous driver understands, and say so in one line when it
cannot.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions
from sqlqueue_orm.aio import AsyncTransport
from tests.conftest import only
from tests.integration.test_asyncio import async_url

#: URL arguments of the asyncpg dialect that libpq (psycopg) rejects: SQLAlchemy's prepared
#: statement cache size (``0`` behind PgBouncer) and asyncpg's TLS mode.
ASYNCPG_ONLY = {"prepared_statement_cache_size": "0", "ssl": "disable"}


@only("postgresql")
def test_asyncpg_only_url_arguments_do_not_reach_the_synchronous_driver(database):
    async def run() -> None:
        url = sa.make_url(async_url(database, "asyncpg")).update_query_dict(ASYNCPG_ONLY)
        transport = AsyncTransport(url.render_as_string(hide_password=False))
        try:
            await transport.create_queue("billing")
            await transport.send("billing", OutgoingMessage(b"one"))
            threads = transport.for_threads()
            assert await asyncio.to_thread(threads.peek, "billing") == 1
            query = threads.engine.url.query
            assert not set(query) & set(ASYNCPG_ONLY)
            assert query["sslmode"] == "disable"  # the TLS mode, in libpq's word
        finally:
            await transport.close()

    asyncio.run(run())


@pytest.mark.parametrize("url", ["sqlite+aiosqlite://", "sqlite+aiosqlite:///:memory:"])
def test_an_in_memory_sqlite_database_is_refused_for_threads_naming_the_url(url):
    async def run() -> None:
        transport = AsyncTransport(url)
        try:
            await transport.create_queue("billing")  # the async side works as ever
            await transport.send("billing", OutgoingMessage(b"one"))
            with pytest.raises(exceptions.ConfigurationError) as raised:
                transport.for_threads()
            message = str(raised.value)
            assert "\n" not in message
            assert url in message and "memory" in message
            assert [m.text for m in await transport.receive("billing")] == ["one"]
        finally:
            await transport.close()

    asyncio.run(run())

