"""AsyncTransport: the :class:`~sqlqueue_orm.transport.Transport` for asyncio applications.

Every method is the synchronous transport's own, run on an asyncio connection through
SQLAlchemy's ``run_sync`` (the synchronous code drives the async driver's connection; each
statement and each guarantee lives once, in the synchronous core). ::

    transport = AsyncTransport("postgresql+asyncpg://app@db/shop")
    await transport.create_queue("orders")
    async with AsyncSession(transport.engine) as session, session.begin():
        session.add(Order(id=7))                                       # your data
        await transport.send("orders", OutgoingMessage(b"..."), session)  # same transaction
    [message] = await transport.receive("orders")
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from sqlqueue_orm import browsing, db, dialects, exceptions, sqlalchemy_internals
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.queue_directory import QueueRef
from sqlqueue_orm.queuing.table_queue import PURGE_BATCH_SIZE
from sqlqueue_orm.transport import Transport

T = TypeVar("T")

#: What the methods take as ``connection=``: an asyncio connection or ORM session, whose
#: transaction the call joins (the session's connection, begun if it was not).
AsyncTarget = AsyncConnection | AsyncSession


def create_async_engine(
    url: str | sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
) -> AsyncEngine:
    """An asyncio engine configured for queue work, as :func:`sqlqueue_orm.db.create_engine`.

    A URL naming no driver gets the dialect's asyncio driver: ``postgresql://`` is
    ``postgresql+asyncpg://``, ``sqlite:///`` is ``sqlite+aiosqlite:///``, ``mssql://`` is
    ``mssql+aioodbc://``. SQLite: WAL and ``BEGIN IMMEDIATE``, as the synchronous engine.

    :raises ConfigurationError: a bad URL, an unknown ``sqlite_synchronous``, no driver.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as error:
        raise exceptions.ConfigurationError(
            f"cannot use database URL {db.without_password(str(url))!r}: {error}"
        ) from error
    if not isinstance(sqlite_synchronous, str) or sqlite_synchronous.upper() not in (
        "OFF", "NORMAL", "FULL", "EXTRA"
    ):
        raise exceptions.ConfigurationError(
            f"sqlite_synchronous {sqlite_synchronous!r} must be one of OFF, NORMAL, FULL, EXTRA"
        )
    support = dialects.for_url(parsed.get_backend_name())
    parsed = support.async_engine_url(parsed)
    kwargs.setdefault("pool_reset_on_return", None)  # as db.create_engine: blocks end their own
    try:
        return support.create_async_engine(
            parsed, sqlite_synchronous=sqlite_synchronous.upper(), **kwargs
        )
    except ImportError as error:
        raise exceptions.ConfigurationError(support.missing_driver(parsed, error)) from error
    except (sa.exc.ArgumentError, sa.exc.InvalidRequestError) as error:  # a sync-only driver
        raise exceptions.ConfigurationError(
            f"cannot use database URL {db.without_password(str(url))!r} with asyncio: {error}"
        ) from error


@contextlib.contextmanager
def connecting(label: str | None = None) -> Iterator[None]:
    """:func:`sqlqueue_orm.db.wrap_db_errors`, and a socket's error while connecting.

    asyncpg raises the ``OSError`` itself (SQLAlchemy wraps only the driver's own errors): it
    becomes a transient :class:`~sqlqueue_orm.exceptions.DatabaseError`.
    """
    try:
        with db.wrap_db_errors(label):
            yield
    except OSError as error:
        where = f"{label}: " if label else ""
        raise exceptions.DatabaseError(
            f"{where}cannot connect: {type(error).__name__}: {error}", transient=True
        ) from error


class AsyncTransport:
    """Message queues in the tables of one database, for asyncio code.

    :param url_or_engine: a URL (the engine is made by :func:`create_async_engine`) or your
        own :class:`~sqlalchemy.ext.asyncio.AsyncEngine`.
    :param options: the :class:`~sqlqueue_orm.transport.Transport`'s keyword arguments
        (``default_schema``, ``verify_schema``, ``delayed_table_suffix``, ...).

    Given ``connection=`` (an :class:`AsyncConnection` or :class:`AsyncSession`) a call runs in
    that transaction and never commits or rolls it back; without, in a short transaction of its
    own on a connection of :attr:`engine`'s pool, committed before it returns.
    """

    def __init__(self, url_or_engine: str | AsyncEngine, **options: Any) -> None:
        if isinstance(url_or_engine, AsyncEngine):
            self.engine = url_or_engine
            self._owns_engine = False
        elif isinstance(url_or_engine, str):
            self.engine = create_async_engine(url_or_engine)
            self._owns_engine = True
        else:
            raise exceptions.ConfigurationError(
                f"AsyncTransport needs a URL or an AsyncEngine, not {url_or_engine!r}"
            )
        #: The synchronous core on the engine's ``sync_engine``: every statement runs through
        #: it, inside ``run_sync`` (use it only there: its engine's connections are async).
        self.transport = Transport(self.engine.sync_engine, **options)
        self._options = options
        self._for_threads: Transport | None = None

    async def __aenter__(self) -> AsyncTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Give back the connections the core keeps; dispose of the engine if we created it.

        The core keeps a connection per thread for the outbox's inline dispatch
        (:meth:`Transport.begin`); on an asyncio engine it belongs to the running event loop.
        """
        await sqlalchemy_internals.greenlet_spawn(self.transport.close)
        threads, self._for_threads = self._for_threads, None
        if threads is not None:
            await asyncio.to_thread(threads.close)
        if self._owns_engine:
            await self.engine.dispose()

    def for_threads(self) -> Transport:
        """A synchronous :class:`Transport` of this database, for threads of their own.

        The asyncio engine's connections belong to the event loop; an endpoint's health and
        control threads read and write through this one, on the dialect's synchronous driver
        (``postgresql+asyncpg://`` is read as ``postgresql://``, asyncpg's own URL arguments
        as libpq's), so no call of theirs waits on the event loop nor blocks it. Made on first
        use (it connects only when used), closed by :meth:`close`.

        :raises ConfigurationError: no synchronous connection reaches this database (an
            in-memory SQLite database), or its driver is not installed.
        """
        threads = self._for_threads
        if threads is None:
            url = self.engine.url
            url = dialects.for_url(url.get_backend_name()).sync_engine_url(url)
            threads = Transport(url.render_as_string(hide_password=False), **self._options)
            self._for_threads = threads
        return threads

    # -- running the synchronous core --------------------------------------------------------
    async def run(
        self, connection: AsyncTarget | None, function: Callable[[Connection], T]
    ) -> T:
        """``function(sync_connection)`` in *connection*'s transaction, else in one of ours.

        The one bridge from asyncio to the synchronous core: *function* runs on the driver's
        connection through ``run_sync``, and may call any synchronous API of the package with
        the :class:`~sqlalchemy.engine.Connection` it is given.
        """
        if isinstance(connection, AsyncSession):
            return await connection.run_sync(lambda session: function(session.connection()))
        if isinstance(connection, AsyncConnection):
            return await connection.run_sync(function)
        if connection is not None:
            raise exceptions.ConfigurationError(
                f"connection= must be an AsyncConnection or AsyncSession, not {connection!r}"
            )
        async with self._own() as own:
            return await own.run_sync(function)

    @contextlib.asynccontextmanager
    async def _own(self, label: str | None = None) -> AsyncIterator[AsyncConnection]:
        """A transaction of ours: committed at the end, rolled back on an exception."""
        with connecting(label):
            async with self.engine.begin() as connection:
                yield connection

    async def _on_any_connection(self, function: Callable[[], T]) -> T:
        """*function*, which opens its own connections of the engine, awaited."""
        with connecting():
            return await sqlalchemy_internals.greenlet_spawn(function)

    # -- installing --------------------------------------------------------------------------
    async def create_queue(self, queue: QueueRef, *, body_string: bool = False) -> bool:
        """Create the queue table if missing (see :meth:`Transport.create_queue`)."""
        return await self._on_any_connection(
            lambda: self.transport.create_queue(queue, body_string=body_string)
        )

    async def create_delayed_table(self, endpoint: QueueRef) -> bool:
        """Create *endpoint*'s delayed table if missing (:meth:`Transport.create_delayed_table`)."""
        return await self._on_any_connection(lambda: self.transport.create_delayed_table(endpoint))

    async def create_subscription_table(self) -> bool:
        """Create the subscription table if missing (idempotent, safe to race)."""
        return await self._on_any_connection(self.transport.create_subscription_table)

    def address_text(self, queue: QueueRef) -> str:
        """*queue* written as this database's .NET transport writes addresses."""
        return self.transport.address_text(queue)

    # -- sending -----------------------------------------------------------------------------
    # Each coroutine takes the arguments of the Transport method it runs, so the signatures
    # repeat theirs on purpose (tests/unit/test_async_public_api.py holds them equal).
    async def send(
        self,
        queue: QueueRef,
        message: OutgoingMessage,
        connection: AsyncTarget | None = None,
        *,
        delay: dt.timedelta | float | None = None,
        deliver_at: dt.datetime | None = None,
        endpoint: QueueRef | None = None,
    ) -> str:
        """Send *message*; with *connection*, in its transaction (:meth:`Transport.send`)."""
        if delay is None and deliver_at is None:
            return (await self.send_many(queue, [message], connection))[0]
        return await self.run(
            connection,
            lambda conn: self.transport.send(
                queue, message, conn, delay=delay, deliver_at=deliver_at, endpoint=endpoint
            ),
        )

    async def send_many(
        self,
        queue: QueueRef,
        messages: Sequence[OutgoingMessage],
        connection: AsyncTarget | None = None,
    ) -> list[str]:
        """Send *messages* in one batch, all or none (:meth:`Transport.send_many`)."""
        ids = await self.run(
            connection, lambda conn: self.transport.send_many(queue, messages, conn)
        )
        if connection is None and ids:  # committed by us: wake this process's endpoints
            address = self.transport.queues.table_queue(queue).address
            for hook in self.transport.sent_hooks:
                hook(address)
        return ids

    async def reply(
        self,
        to: IncomingMessage,
        message: OutgoingMessage,
        connection: AsyncTarget | None = None,
    ) -> str:
        """Send *message* to *to*'s ``ReplyToAddress`` as a reply (:meth:`Transport.reply`)."""
        return await self.run(connection, lambda conn: self.transport.reply(to, message, conn))

    async def publish(
        self,
        event: OutgoingMessage | Any,
        connection: AsyncTarget | None = None,
        *,
        type_names: Mapping[type[Any], str] | None = None,
        topics: Sequence[str] | None = None,
    ) -> str:
        """Send *event* once to each queue subscribed to it (:meth:`Transport.publish`)."""
        return await self.run(
            connection,
            lambda conn: self.transport.publish(
                event, conn, type_names=type_names, topics=topics
            ),
        )

    async def subscribe(
        self,
        endpoint: str,
        topic: str,
        queue: QueueRef | None = None,
        connection: AsyncTarget | None = None,
    ) -> None:
        """Subscribe *endpoint* to *topic*, delivered to *queue* (:meth:`Transport.subscribe`)."""
        await self.run(
            connection, lambda conn: self.transport.subscribe(endpoint, topic, queue, conn)
        )

    async def unsubscribe(
        self, endpoint: str, topic: str, connection: AsyncTarget | None = None
    ) -> None:
        """Remove *endpoint*'s subscription to *topic*."""
        await self.run(connection, lambda conn: self.transport.unsubscribe(endpoint, topic, conn))

    # -- receiving and reading ---------------------------------------------------------------
    async def receive(
        self, queue: QueueRef, max_messages: int = 1, connection: AsyncTarget | None = None
    ) -> list[IncomingMessage]:
        """Take up to *max_messages* off the queue, oldest first (:meth:`Transport.receive`).

        With *connection* the rows are deleted in its transaction: roll it back and they are
        back in their places. Without, they are deleted and committed before this returns.
        """
        return await self.run(
            connection, lambda conn: self.transport.receive(queue, max_messages, conn)
        )

    async def browse(
        self,
        queue: QueueRef,
        max_messages: int = 10,
        connection: AsyncTarget | None = None,
        *,
        after: int | None = None,
    ) -> list[IncomingMessage]:
        """Messages, oldest first, without taking them (:meth:`Transport.browse`)."""
        return await self.run(
            connection,
            lambda conn: self.transport.browse(queue, max_messages, conn, after=after),
        )

    async def peek(self, queue: QueueRef, connection: AsyncTarget | None = None) -> int:
        """Estimated message count (:meth:`Transport.peek`)."""
        return await self.run(connection, lambda conn: self.transport.peek(queue, conn))

    async def browse_delayed(
        self,
        endpoint: QueueRef | None = None,
        schemas: Iterable[str | None] | None = None,
        max_messages: int = 1_000,
    ) -> list[browsing.DelayedMessage]:
        """Delayed messages waiting, earliest due first (:meth:`Transport.browse_delayed`)."""
        return await self._on_any_connection(
            lambda: self.transport.browse_delayed(endpoint, schemas, max_messages)
        )

    async def purge_all(self, queue: QueueRef) -> int:
        """Delete every message of the queue; return how many."""
        return await self._on_any_connection(lambda: self.transport.purge_all(queue))

    async def purge_expired(self, queue: QueueRef, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete expired messages (:meth:`Transport.purge_expired`); return how many."""
        return await self._on_any_connection(
            lambda: self.transport.purge_expired(queue, batch_size)
        )
