"""Transport: the entry point. Queues by address, on one engine, joining the caller's transaction.

::

    transport = Transport("sqlite:///app.db")
    transport.create_queue("orders")
    with transport.engine.begin() as connection:     # your transaction
        connection.execute(...)                       # your data
        transport.send("orders", OutgoingMessage(b"..."), connection=connection)
    [message] = transport.receive("orders")
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.queuing.table_queue import PURGE_BATCH_SIZE, TableQueue
from sqlqueue_orm.schema import QueueInstaller, SchemaInspector

log = logging.getLogger(__name__)

QueueRef = str | addressing.QueueAddress


class _OwnTransaction:
    """Context manager of :meth:`Transport._own_cursor` (a class: cheaper than a generator)."""

    __slots__ = ("_cursor", "_fairy", "_kept", "_transport")

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def __enter__(self) -> Any:
        transport = self._transport
        self._fairy, self._kept = transport._checkout()
        self._cursor = cursor = self._fairy.cursor()
        if transport._begin_statement:
            try:
                cursor.execute(transport._begin_statement)
            except BaseException as error:
                transport._end_own(self._fairy, cursor, self._kept, error)
                raise
        return cursor

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self._transport._end_own(self._fairy, self._cursor, self._kept, error)


class _HeldConnection:
    """A pooled connection a thread keeps between short transactions; returned when dropped."""

    def __init__(self, fairy: Any, transport: Transport) -> None:
        self.fairy = fairy
        self.pid = os.getpid()
        self._transport = transport
        self._closed = False
        transport._held_all.add(self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport._release(self)
            self.fairy.close()

    def abandon(self) -> None:
        """Forget the connection without touching it (it belongs to another process)."""
        if not self._closed:
            self._closed = True
            self._transport._release(self)

    def __del__(self) -> None:  # the thread ended: its threading.local let go of us
        try:
            self.close()
        except Exception:  # noqa: S110  (interpreter shutdown: nothing to give back to)
            pass


class Transport:
    """Message queues in the tables of one database.

    :param url_or_engine: a SQLAlchemy URL (the engine is made by
        :func:`sqlqueue_orm.db.create_engine`) or your own :class:`~sqlalchemy.engine.Engine`.
    :param default_schema: schema of queue addresses that name none.
    :param verify_schema: warn once per queue, on first use, about legacy table shapes.
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        default_schema: str | None = None,
        verify_schema: bool = True,
    ) -> None:
        if isinstance(url_or_engine, Engine):
            self.engine = url_or_engine
            self._owns_engine = False
        elif isinstance(url_or_engine, str):
            try:
                self.engine = db.create_engine(url_or_engine)
            except Exception as error:
                raise exceptions.ConfigurationError(
                    f"cannot use database URL {url_or_engine!r}: {error}"
                ) from error
            self._owns_engine = True
        else:
            raise exceptions.ConfigurationError(
                f"Transport needs a URL or an Engine, not {url_or_engine!r}"
            )
        self.default_schema = default_schema
        self.verify_schema = verify_schema
        self.installer = QueueInstaller()
        self.inspector = SchemaInspector()
        self._queues: dict[addressing.QueueAddress, TableQueue] = {}
        self._by_reference: dict[QueueRef, TableQueue] = {}
        self._local = threading.local()
        # Weak: a thread that ends drops its _HeldConnection, whose __del__ gives it back.
        self._held_all: weakref.WeakSet[_HeldConnection] = weakref.WeakSet()
        self._held_count = 0
        pool_size = getattr(self.engine.pool, "size", lambda: 2)()
        self._held_limit = max(1, int(pool_size) // 2)
        self._verified: set[addressing.QueueAddress] = set()
        self._lock = threading.Lock()
        # SQLite: take the write lock up front (see db.create_engine); others begin implicitly.
        self._begin_statement = "BEGIN IMMEDIATE" if self.engine.dialect.name == "sqlite" else ""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Give back the connections threads hold; dispose of the engine if we created it."""
        for held in list(self._held_all):
            held.close()
        self._local = threading.local()
        if self._owns_engine:
            self.engine.dispose()

    # -- addressing ------------------------------------------------------------------------
    def address(self, queue: QueueRef) -> addressing.QueueAddress:
        """Parse *queue* and apply the default schema."""
        address = addressing.QueueAddress.coerce(queue)
        if address.schema is None and self.default_schema is not None:
            address = addressing.QueueAddress(address.table, self.default_schema, address.catalog)
        return address

    def queue(self, queue: QueueRef) -> TableQueue:
        """The :class:`TableQueue` of *queue* (cached, also by the text it was named with)."""
        table_queue = self._by_reference.get(queue)
        if table_queue is not None:
            return table_queue
        address = self.address(queue)
        with self._lock:
            table_queue = self._queues.get(address)
            if table_queue is None:
                table_queue = TableQueue(address, self.engine.dialect)
                self._queues[address] = table_queue
            if len(self._by_reference) < 10_000:
                self._by_reference[queue] = table_queue
        return table_queue

    @contextmanager
    def _connection(self, connection: Connection | None) -> Iterator[Connection]:
        if connection is not None:
            yield connection
            return
        with self.engine.begin() as own:
            yield own

    def _verify(self, connection: Connection, table_queue: TableQueue) -> None:
        address = table_queue.address
        if not self.verify_schema or address in self._verified:
            return
        self._verified.add(address)
        with db.wrap_db_errors(table_queue.name):
            self.inspector.warn(connection, address)

    def _ready(self, table_queue: TableQueue) -> None:
        """Run the one-time checks (schema warnings, probes) on a connection of our own."""
        if table_queue.probed and table_queue.address in self._verified:
            return
        with self.engine.connect() as connection:
            self._verify(connection, table_queue)
            table_queue.probe(connection)

    def _checkout(self) -> tuple[Any, bool]:
        """A pooled DBAPI connection for this thread, and whether it stays with the thread.

        Up to half the pool's size, threads keep the connection of their short transactions
        between calls (a consumer loop then pays no checkout per message); it goes back to the
        pool when the thread ends or the transport is closed. Other threads check out per call.
        """
        held: _HeldConnection | None = getattr(self._local, "held", None)
        if held is not None:
            if held.pid == os.getpid():
                return held.fairy, True
            # A forked child inherited the parent's socket: never use it, never close it.
            self._local.held = None
            held.abandon()
        fairy = self.engine.raw_connection()
        with self._lock:
            keep = self._held_count < self._held_limit
            if keep:
                self._held_count += 1
        if keep:
            self._local.held = _HeldConnection(fairy, self)
        return fairy, keep

    def _release(self, held: _HeldConnection) -> None:
        with self._lock:
            self._held_count -= 1
        self._held_all.discard(held)

    def _own_cursor(self) -> _OwnTransaction:
        """A short transaction of our own on a pooled DBAPI connection: commit or roll back.

        The hot path without a caller's connection: the same statements, minus SQLAlchemy's
        per-transaction machinery. A connection that died is invalidated, not pooled again.
        """
        return _OwnTransaction(self)

    def _end_own(self, fairy: Any, cursor: Any, kept: bool, error: BaseException | None) -> None:
        """Finish a transaction of :class:`_OwnTransaction` (commit, or roll back on *error*)."""
        try:
            if error is None:
                fairy.commit()
                return
            original = error.__cause__ or error
            dead = isinstance(original, Exception) and self.engine.dialect.is_disconnect(
                original,  # type: ignore[arg-type]
                fairy.dbapi_connection,
                cursor,
            )
            if not dead:
                try:
                    fairy.rollback()
                except Exception:  # the connection is unusable: drop it
                    dead = True
            if dead:
                held = getattr(self._local, "held", None)
                if held is not None:
                    self._local.held = None
                    held.close()
                else:
                    fairy.invalidate()
                    fairy.close()
                kept = True  # already given back
        finally:
            cursor.close()
            if not kept:
                fairy.close()

    # -- installing ------------------------------------------------------------------------
    def create_queue(self, queue: QueueRef, *, body_string: bool = False) -> bool:
        """Create the queue table if it does not exist; return whether it was created.

        Safe to call from several processes at once. Needs CREATE TABLE rights; running needs
        only SELECT, INSERT and DELETE.
        """
        address = self.address(queue)
        with db.wrap_db_errors(str(address)), self.engine.begin() as connection:
            return self.installer.create(connection, address, body_string=body_string)

    def create_queues(self, queues: Iterable[QueueRef]) -> None:
        """Create each of *queues* (see :meth:`create_queue`)."""
        for queue in queues:
            self.create_queue(queue)

    # -- sending ---------------------------------------------------------------------------
    def send(
        self, queue: QueueRef, message: OutgoingMessage, connection: Connection | None = None
    ) -> str:
        """Send *message*; with *connection*, inside its transaction. Return the message id."""
        return self.send_many(queue, [message], connection)[0]

    def send_many(
        self,
        queue: QueueRef,
        messages: Sequence[OutgoingMessage],
        connection: Connection | None = None,
    ) -> list[str]:
        """Send *messages* in one batch (all or none); return their message ids."""
        table_queue = self.queue(queue)
        prepared = [message.prepare() for message in messages]
        if connection is not None:
            self._verify(connection, table_queue)
            table_queue.send(connection, prepared)
        elif prepared:
            self._ready(table_queue)
            with self._own_cursor() as cursor:
                table_queue.send_on_cursor(cursor, prepared)
        return [item.message_id for item in prepared]

    # -- receiving -------------------------------------------------------------------------
    def receive(
        self, queue: QueueRef, max_messages: int = 1, connection: Connection | None = None
    ) -> list[IncomingMessage]:
        """Take up to *max_messages* off the queue, oldest first.

        With *connection*, the rows are deleted in its transaction: roll it back and they return
        to their places. Without, they are deleted and committed before this returns (handle them
        or lose them: pass a connection for at-least-once processing). Expired messages come
        back with ``expired=True``; they are gone from the queue all the same.
        """
        table_queue = self.queue(queue)
        if connection is not None:
            self._verify(connection, table_queue)
            return table_queue.receive(connection, max_messages)
        self._ready(table_queue)
        with self._own_cursor() as cursor:
            return table_queue.receive_on_cursor(cursor, max_messages)

    def browse(
        self,
        queue: QueueRef,
        max_messages: int = 10,
        connection: Connection | None = None,
        *,
        after: int | None = None,
    ) -> list[IncomingMessage]:
        """Up to *max_messages* messages, oldest first, without taking them off the queue.

        Reads every row, expired ones (flagged ``expired=True``) and rows another receiver holds
        included; nothing is locked or deleted. *after*: only rows whose RowVersion is above it
        (page on with the last ``row_version`` seen).
        """
        address = self.address(queue)
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise exceptions.ConfigurationError(
                f"max_messages {max_messages!r} must be a whole number of at least 1"
            )
        table = queue_table(address.table, db.schema_argument(address))
        statement = sa.select(
            table.c.Id, table.c.RowVersion, table.c.Expires, table.c.Headers, table.c.Body
        )
        if after is not None:
            statement = statement.where(table.c.RowVersion > after)
        statement = statement.order_by(table.c.RowVersion).limit(max_messages)
        with db.wrap_db_errors(str(address)), self._connection(connection) as conn:
            rows = conn.execute(statement).all()
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)  # Expires is naive UTC
        return [
            IncomingMessage.from_row(
                row.Id if isinstance(row.Id, uuid.UUID) else uuid.UUID(str(row.Id)),
                int(row.RowVersion),
                row.Headers,
                None if row.Body is None else bytes(row.Body),
                row.Expires is not None and row.Expires <= now,
                str(address),
            )
            for row in rows
        ]

    def peek(self, queue: QueueRef, connection: Connection | None = None) -> int:
        """Estimated message count (max - min RowVersion): cheap at any queue size."""
        table_queue = self.queue(queue)
        with self._connection(connection) as conn:
            return table_queue.peek(conn)

    def purge_expired(self, queue: QueueRef, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete expired messages, one transaction per batch; return how many were deleted."""
        table_queue = self.queue(queue)
        total = 0
        while True:
            with self.engine.begin() as connection:
                deleted = table_queue.purge_expired(connection, batch_size)
            total += deleted
            if deleted:
                log.info(
                    "queue %s: purged %d expired message(s) (%d so far)",
                    table_queue.name,
                    deleted,
                    total,
                )
            if deleted < batch_size:
                return total

    def purge_all(self, queue: QueueRef) -> int:
        """Delete every message of the queue; return how many."""
        table_queue = self.queue(queue)
        with self.engine.begin() as connection:
            deleted = table_queue.purge_all(connection)
        log.info("queue %s: purged all %d message(s)", table_queue.name, deleted)
        return deleted

    def list_queues(self, schemas: Iterable[str | None] | None = None) -> list[tuple[str, int]]:
        """Queue tables found in *schemas* (default: the default schema), with estimated counts."""
        chosen = list(schemas) if schemas is not None else [self.default_schema]
        with db.wrap_db_errors(), self.engine.begin() as connection:
            found = self.inspector.find_queue_tables(connection, chosen)
            return [
                (str(info.address), self.queue(info.address).peek(connection)) for info in found
            ]
