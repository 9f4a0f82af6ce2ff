"""asyncio: sends, receives and a unit of work in an async connection's or session's transaction.

On asyncpg, psycopg's async driver, aiosqlite and aioodbc (``AsyncConnection`` and
``AsyncSession`` of SQLAlchemy's asyncio extension).

* ``transport``: :class:`AsyncTransport`, the :class:`~sqlqueue_orm.transport.Transport`'s
  methods as coroutines, and :func:`create_async_engine`;
* ``session``: :class:`AsyncUnitOfWork`, an ``AsyncSession`` and sends that commit together;
* ``endpoint``: :class:`AsyncEndpoint`, an endpoint whose handlers are ``async def``;
* ``context``: :class:`AsyncHandlerContext`, what those handlers get.

One core, not two: each coroutine runs the synchronous transport's own code on the asyncio
connection through SQLAlchemy's ``run_sync`` (see ``docs/asyncio.md``).
"""

from sqlqueue_orm.aio.context import AsyncHandlerContext
from sqlqueue_orm.aio.endpoint import AsyncEndpoint
from sqlqueue_orm.aio.session import AsyncUnitOfWork
from sqlqueue_orm.aio.transport import AsyncTransport, create_async_engine

__all__ = [
    "AsyncEndpoint",
    "AsyncHandlerContext",
    "AsyncTransport",
    "AsyncUnitOfWork",
    "create_async_engine",
]
