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

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, Self

from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import (
    addressing,
    browsing,
    config,
    connections,
    db,
    delayed,
    dialects,
    exceptions,
    headers,
    transactions,
)
from sqlqueue_orm import instrumentation as _instrumentation
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.models import delayed_table as delayed_model
from sqlqueue_orm.pubsub import publishing
from sqlqueue_orm.pubsub.subscriptions import SubscriptionSettings, SubscriptionStore
from sqlqueue_orm.queue_directory import QueueDirectory, QueueRef
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.queuing.table_queue import PURGE_BATCH_SIZE, TableQueue
from sqlqueue_orm.schema import QueueInstaller

log = logging.getLogger(__name__)


class _Closable(Protocol):
    def close(self) -> None: ...


class Closing:
    """A context manager that ends by calling the class's own ``close`` (what it owns, given back).

    The base of :class:`Transport`, :class:`~sqlqueue_orm.sending.outbox.Outbox` and
    :class:`~sqlqueue_orm.receiving.endpoint.Endpoint`: ``with Transport(url) as transport:``.
    """

    def __enter__(self) -> Self:
        return self

    def __exit__(self: _Closable, *exc_info: object) -> None:
        self.close()


class Transport(Closing):
    """Message queues in the tables of one database.

    :param url_or_engine: a SQLAlchemy URL (the engine is made by
        :func:`sqlqueue_orm.db.create_engine`) or your own :class:`~sqlalchemy.engine.Engine`.
    :param default_schema: schema of queue addresses that name none.
    :param verify_schema: warn once per queue, on first use, about legacy table shapes.
    :param sql_server_layout: how :meth:`create_queue` lays out SQL Server tables:
        ``"clustered"`` (default) or ``"heap"``, the NServiceBus 8+ layout for tables shared with
        .NET endpoints (see :class:`~sqlqueue_orm.config.QueueSettings`).
    :param delayed_table_suffix: delayed messages of endpoint ``E`` wait in table
        ``E.<suffix>`` (NServiceBus's ``TableSuffix``, default ``Delayed``).
    :param instrumentation: traces and metrics of this transport's sends, receives and peeks
        (:mod:`sqlqueue_orm.instrumentation`); default: whatever
        :func:`~sqlqueue_orm.instrumentation.set_instrumentation` sets, now or later.
    :param subscriptions: the subscription table and the subscriber cache of :meth:`publish`
        (:class:`~sqlqueue_orm.pubsub.subscriptions.SubscriptionSettings`).

    :attr:`queues` (a :class:`~sqlqueue_orm.queue_directory.QueueDirectory`: a queue's parsed
    address and its :class:`~sqlqueue_orm.queuing.table_queue.TableQueue`, delayed tables, the
    first-use checks) and :attr:`subscriptions` serve the package's own parts: the endpoint and
    its pump, the outbox, the error queue.
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        default_schema: str | None = None,
        verify_schema: bool = True,
        sql_server_layout: str = "clustered",
        delayed_table_suffix: str = delayed_model.DEFAULT_SUFFIX,
        instrumentation: _instrumentation.Instrumentation | None = None,
        subscriptions: SubscriptionSettings | None = None,
    ) -> None:
        if not isinstance(delayed_table_suffix, str) or not delayed_table_suffix.strip():
            raise exceptions.ConfigurationError(
                f"delayed_table_suffix {delayed_table_suffix!r} must not be empty"
            )
        settings = config.QueueSettings(sql_server_layout=sql_server_layout)
        if isinstance(url_or_engine, Engine):
            engine = url_or_engine
            self._owns_engine = False
        elif isinstance(url_or_engine, str):
            try:
                engine = db.create_engine(url_or_engine)
            except Exception as error:
                raise exceptions.ConfigurationError(
                    f"cannot use database URL {db.without_password(url_or_engine)!r}: {error}"
                ) from error
            self._owns_engine = True
        else:
            raise exceptions.ConfigurationError(
                f"Transport needs a URL or an Engine, not {url_or_engine!r}"
            )
        self.engine = engine
        self.default_schema = default_schema
        self.verify_schema = verify_schema
        self.delayed_table_suffix = delayed_table_suffix
        #: The queues of this transport's engine: addresses parsed, table queues kept, first use
        #: checked (the endpoint, its pump and receive modes take their table queue from here).
        self.queues = QueueDirectory(engine, default_schema, verify_schema, delayed_table_suffix)
        self._lock = threading.Lock()
        self._installer = QueueInstaller(settings)
        # SQLite: take the write lock up front (see db.create_engine); others begin implicitly.
        begin = dialects.for_dialect(self.engine).begin
        self._connections = connections.ThreadConnections(
            self.engine, begin, sql.for_dialect(self.engine.dialect).autocommit,
            db.translate_error,
        )
        self._kept = transactions.KeptConnections(
            self.engine, self._connections.reserve, self._connections.unreserve,
            db.translate_error,
        )
        #: Called with the queue's address after each send this transport committed itself
        #: (endpoints of this process register here to wake up at once).
        self.sent_hooks: list[Callable[[addressing.QueueAddress], object]] = []
        #: Called with a delayed table's address and the seconds until a message just stored
        #: there is due (the endpoint's mover registers here to wake up in time).
        self.delayed_hooks: list[Callable[[addressing.QueueAddress, float], object]] = []
        #: The hooks of traces and metrics, or None (then each hook site is this one check).
        self.instrumentation = _instrumentation.follow(self)
        if instrumentation is not None:
            _instrumentation.unfollow(self)
            self.instrumentation = instrumentation
        self._subscription_settings = subscriptions
        self._subscription_store: SubscriptionStore | None = None

    def close(self) -> None:
        """Give back the connections threads hold; dispose of the engine if we created it."""
        self._connections.close()
        self._kept.close()
        if self._owns_engine:
            self.engine.dispose()

    def begin(self) -> transactions.KeptTransaction:
        """``engine.begin()``'s block on a connection this thread keeps (no checkout per block).

        See :mod:`sqlqueue_orm.transactions`; pass the connection to receive, send, your writes.
        """
        return self._kept.begin()

    # -- addressing ------------------------------------------------------------------------
    def address_text(self, queue: QueueRef) -> str:
        """*queue* written as this database's .NET transport writes addresses.

        Put it in ``NServiceBus.ReplyToAddress`` so .NET endpoints can reply:
        ``orders@[dbo]`` on SQL Server, ``"public"."orders"`` on PostgreSQL (where a queue
        named without a schema is in the connection's current one).
        """
        return self.queues.qualified(queue).format(self.engine.dialect.name)

    def _connection(self, connection: Connection | None) -> AbstractContextManager[Connection]:
        """*connection*, else a transaction of ours (:meth:`begin`) for a ``with`` block."""
        return nullcontext(connection) if connection is not None else self._kept.begin()

    def _reading(self, connection: Connection | None) -> AbstractContextManager[Connection]:
        """*connection*, else one of ours that only reads (SQLite: no write lock taken)."""
        return nullcontext(connection) if connection is not None else db.reading(self.engine)

    # -- delayed delivery ------------------------------------------------------------------
    def create_delayed_table(self, endpoint: QueueRef) -> bool:
        """Create *endpoint*'s delayed table if missing; return whether it was created."""
        address = self.queues.delayed_address(endpoint)
        with db.wrap_db_errors(str(address)), self.engine.begin() as connection:
            return self._installer.create_delayed(connection, address)

    def _send_delayed(
        self,
        queue: QueueRef,
        messages: Sequence[OutgoingMessage],
        connection: Connection | None,
        due_ms: int,
        endpoint: QueueRef | None,
    ) -> list[str]:
        """Store *messages* in the delayed table of *endpoint* (default: of *queue*)."""
        destination = self.queues.address(queue)
        table = self.queues.delayed_table(destination if endpoint is None else endpoint)
        forward = self.address_text(destination)
        prepared = delayed.prepare(messages, forward, due_ms)
        with db.wrap_db_errors(table.name), self._connection(connection) as conn:
            for item in prepared:
                table.store(conn, item, due_ms)
        log.debug("queue %s: %d message(s) stored in %s, due in %d ms",
                  forward, len(prepared), table.name, due_ms)
        for hook in self.delayed_hooks:
            hook(table.address, due_ms / 1000)
        return [item.message_id for item in prepared]

    def browse_delayed(
        self,
        endpoint: QueueRef | None = None,
        schemas: Iterable[str | None] | None = None,
        max_messages: int = 1_000,
    ) -> list[browsing.DelayedMessage]:
        """Delayed messages waiting, earliest due first, without taking them.

        :param endpoint: only that endpoint's delayed table; default every delayed table
            (``*.<suffix>`` with the delayed columns) in *schemas* (default: the default one).
        """
        with db.wrap_db_errors(), db.reading(self.engine) as connection:
            if endpoint is not None:
                addresses = [self.queues.delayed_address(endpoint)]
                browsing.require_delayed_table(connection, str(endpoint), addresses[0])
            else:
                chosen = list(schemas) if schemas is not None else [self.default_schema]
                addresses = self.queues.inspector.find_delayed_tables(
                    connection, chosen, self.delayed_table_suffix
                )
            return browsing.read_delayed(connection, addresses, max_messages)

    # -- installing ------------------------------------------------------------------------
    def create_queue(self, queue: QueueRef, *, body_string: bool = False) -> bool:
        """Create the queue table if it does not exist; return whether it was created.

        Safe to call from several processes at once. Needs CREATE TABLE rights; running needs
        only SELECT, INSERT and DELETE.
        """
        address = self.queues.address(queue)
        with db.wrap_db_errors(str(address)), self.engine.begin() as connection:
            return self._installer.create(connection, address, body_string=body_string)

    def create_queues(self, queues: Iterable[QueueRef]) -> None:
        """Create each of *queues* (see :meth:`create_queue`)."""
        for queue in queues:
            self.create_queue(queue)

    # -- sending ---------------------------------------------------------------------------
    def send(
        self,
        queue: QueueRef,
        message: OutgoingMessage,
        connection: Connection | None = None,
        *,
        delay: dt.timedelta | float | None = None,
        deliver_at: dt.datetime | None = None,
        endpoint: QueueRef | None = None,
    ) -> str:
        """Send *message*; with *connection*, inside its transaction. Return the message id.

        :param delay: deliver it that long (seconds or a timedelta) after the database's now:
            it waits in a delayed table (see ``docs/recoverability.md``) until then.
        :param deliver_at: deliver it at that moment (naive means UTC) instead.
        :param endpoint: whose delayed table holds it (the sender's, as NServiceBus does; its
            endpoint must be running to move it); default the destination's own.
        :raises ConfigurationError: both *delay* and *deliver_at*, a negative delay, or a
            delay on a message with a time_to_be_received.
        """
        due_ms = delayed.due_ms(delay, deliver_at)
        if due_ms is not None:
            if self.instrumentation is not None:  # a send span; the context waits with it
                return self.instrumentation.send(
                    self.queues.table_queue(queue).name,
                    [message],
                    lambda traced: self._send_delayed(queue, traced, connection, due_ms, endpoint),
                )[0]
            return self._send_delayed(queue, [message], connection, due_ms, endpoint)[0]
        return self.send_many(queue, [message], connection)[0]

    def send_many(
        self,
        queue: QueueRef,
        messages: Sequence[OutgoingMessage],
        connection: Connection | None = None,
    ) -> list[str]:
        """Send *messages* in one batch (all or none); return their message ids."""
        table_queue = self.queues.table_queue(queue)
        if self.instrumentation is not None:
            return self.instrumentation.send(
                table_queue.name,
                messages,
                lambda traced: self._send_many(table_queue, traced, connection),
            )
        return self._send_many(table_queue, messages, connection)

    def _send_many(
        self,
        table_queue: TableQueue,
        messages: Sequence[OutgoingMessage],
        connection: Connection | None,
    ) -> list[str]:
        """:meth:`send_many` to the resolved *table_queue*, without the send hook."""
        prepared = [message.prepare() for message in messages]
        if connection is not None:
            self.queues.first_use(connection, table_queue)
            table_queue.send(connection, prepared)
        elif prepared:
            self.queues.ready(table_queue)
            try:  # a connection that cannot be had raises SQLAlchemy's error: translate it
                if self._connections.observed():  # cursor events fire only via a Connection
                    with self.engine.begin() as own:
                        table_queue.send(own, prepared)
                elif len(prepared) == 1:  # one INSERT: atomic alone, no BEGIN/COMMIT needed
                    with self._connections.statement() as cursor:
                        table_queue.send_on_cursor(cursor, prepared)
                else:  # executemany is not atomic in autocommit: all or none needs a transaction
                    with self._connections.transaction() as cursor:
                        table_queue.send_on_cursor(cursor, prepared)
            except db.DRIVER_ERRORS as error:
                raise db.translate_error(error, table_queue.name) from error
            for hook in self.sent_hooks:
                hook(table_queue.address)
        return [item.message_id for item in prepared]

    def reply(
        self,
        to: IncomingMessage,
        message: OutgoingMessage,
        connection: Connection | None = None,
    ) -> str:
        """Send *message* to the ``NServiceBus.ReplyToAddress`` of *to*, as a reply.

        The address is read in this database's .NET form (a .NET PostgreSQL endpoint writes
        ``"schema"."table"``). Sets ``NServiceBus.MessageIntent`` to ``Reply`` and carries
        *to*'s correlation id (else its message id) and conversation id, as NServiceBus does,
        unless *message* sets them. Return the message id.

        :raises ConfigurationError: *to* has no ReplyToAddress (or one that cannot be read).
        """
        address_text = to.headers.get(headers.REPLY_TO_ADDRESS)
        if not address_text:
            raise exceptions.ConfigurationError(
                f"message {to.message_id!r} from queue {to.queue!r} has no "
                f"{headers.REPLY_TO_ADDRESS} header to reply to"
            )
        reply_headers: dict[str, str | None] = {
            headers.MESSAGE_INTENT: "Reply",
            headers.CORRELATION_ID: to.headers.get(headers.CORRELATION_ID) or to.message_id,
        }
        conversation = to.headers.get(headers.CONVERSATION_ID)
        if conversation:
            reply_headers[headers.CONVERSATION_ID] = conversation
        reply_headers.update(message.headers)
        replying = dataclasses.replace(message, headers=reply_headers)
        destination = self.queues.address(address_text)
        log.debug("queue %s: replying to message %s", destination, to.message_id)
        return self.send(destination, replying, connection)

    # -- publish/subscribe -----------------------------------------------------------------
    @property
    def subscriptions(self) -> SubscriptionStore:
        """The subscription table and its cache (NServiceBus's ``SubscriptionRouting``)."""
        if self._subscription_store is None:
            with self._lock:
                if self._subscription_store is None:
                    settings = self._subscription_settings or SubscriptionSettings()
                    if settings.schema is None and self.default_schema is not None:
                        settings = dataclasses.replace(settings, schema=self.default_schema)
                    self._subscription_store = SubscriptionStore(
                        self.engine, settings, own_connections=self._connections
                    )
        return self._subscription_store

    def create_subscription_table(self) -> bool:
        """Create the subscription table if missing (idempotent, safe to race)."""
        return self.subscriptions.create_table()

    def subscribe(
        self,
        endpoint: str,
        topic: str,
        queue: QueueRef | None = None,
        connection: Connection | None = None,
    ) -> None:
        """Subscribe *endpoint* to *topic* (an event's full type name), delivered to *queue*.

        *queue* defaults to the queue named like the endpoint; it is stored in the address form
        of this database's .NET transport, as a .NET subscriber stores its own.
        """
        address = self.address_text(endpoint if queue is None else queue)
        self.subscriptions.subscribe(endpoint, topic, address, connection)

    def unsubscribe(self, endpoint: str, topic: str, connection: Connection | None = None) -> None:
        """Remove *endpoint*'s subscription to *topic*."""
        self.subscriptions.unsubscribe(endpoint, topic, connection)

    def publish(
        self,
        event: OutgoingMessage | Any,
        connection: Connection | None = None,
        *,
        type_names: Mapping[type[Any], str] | None = None,
        topics: Sequence[str] | None = None,
    ) -> str:
        """Send *event* once to each distinct queue subscribed to its type or a base type.

        Every copy is the same message (one message id) with ``MessageIntent: Publish``. With
        *connection*, all copies go in its transaction; without, in one of their own. Return
        the message id (also when nobody subscribed: then nothing is sent).

        :param event: a pydantic model or an :class:`OutgoingMessage` (see
            :func:`sqlqueue_orm.pubsub.publishing.prepare`).
        :param type_names: .NET type names of models (the topics .NET subscribers use).
        :param topics: publish on these topics instead of the event type's.
        """
        outgoing, chosen = publishing.prepare(event, type_names, topics)
        assert outgoing.message_id is not None
        subscribers = self.subscriptions.subscribers(chosen, connection)
        destinations = publishing.one_per_table(
            (self.queues.address(text) for text in subscribers),
            self.engine.dialect.default_schema_name,
        )
        if destinations:
            with self._connection(connection) as conn:
                for destination in destinations:
                    self.send(destination, outgoing, conn)
            if connection is None:
                for destination in destinations:
                    for hook in self.sent_hooks:
                        hook(destination)
        log.info(
            "queue %s: published %s (%s) to %d subscriber(s)",
            ", ".join(str(destination) for destination in destinations) or "-",
            outgoing.message_id,
            chosen[0],
            len(destinations),
        )
        return outgoing.message_id

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
        if self.instrumentation is not None:
            name = self.queues.table_queue(queue).name
            return self.instrumentation.receive(
                name, lambda: self._receive(queue, max_messages, connection)
            )
        return self._receive(queue, max_messages, connection)

    def _receive(
        self, queue: QueueRef, max_messages: int, connection: Connection | None
    ) -> list[IncomingMessage]:
        table_queue = self.queues.table_queue(queue)
        if connection is not None:
            self.queues.first_use(connection, table_queue)
            return table_queue.receive(connection, max_messages)
        self.queues.ready(table_queue)
        try:  # a connection that cannot be had raises SQLAlchemy's error: translate it
            if self._connections.observed():  # cursor events fire only through a Connection
                with self.engine.begin() as own:
                    return table_queue.receive(own, max_messages)
            # One DELETE ... RETURNING deletes and returns the rows: atomic alone, in autocommit.
            with self._connections.statement() as cursor:
                return table_queue.receive_on_cursor(cursor, max_messages)
        except db.DRIVER_ERRORS as error:
            raise db.translate_error(error, table_queue.name) from error

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
        table_queue = self.queues.table_queue(queue)
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise exceptions.ConfigurationError(
                f"max_messages {max_messages!r} must be a whole number of at least 1"
            )
        with self._reading(connection) as conn:
            table_queue.check_layout(conn)  # once: an outdated layout says so (SchemaOutdated)
            return browsing.read_queue(conn, table_queue.address, max_messages, after)

    def peek(self, queue: QueueRef, connection: Connection | None = None) -> int:
        """Estimated message count (max - min RowVersion): cheap at any queue size."""
        table_queue = self.queues.table_queue(queue)
        # The first peek on a Connection: it looks the layout up (an outdated one is refused).
        if connection is not None or self._connections.observed() or not table_queue.layout_known:
            with self._reading(connection) as conn:
                count = table_queue.peek(conn)
        else:
            # One SELECT: in autocommit on the thread's connection, one round trip (the pump
            # peeks after every wake-up and batch; BEGIN and COMMIT around it were two more).
            try:
                try:
                    with self._connections.statement() as cursor:
                        count = table_queue.peek_on_cursor(cursor)
                except exceptions.DatabaseError:
                    # The thread's kept connection may have died since its last use (a server
                    # restart, an outage): it was dropped, and a read is safe to run again once.
                    with self._connections.statement() as cursor:
                        count = table_queue.peek_on_cursor(cursor)
            except db.DRIVER_ERRORS as error:  # no connection to be had
                raise db.translate_error(error, table_queue.name) from error
        if self.instrumentation is not None:
            self.instrumentation.peeked(table_queue.name, count)
        return count

    def purge_expired(self, queue: QueueRef, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete expired messages, one transaction per batch; return how many were deleted."""
        table_queue = self.queues.table_queue(queue)
        total = 0
        while True:
            with db.wrap_db_errors(table_queue.name), self.engine.begin() as connection:
                deleted = table_queue.purge_expired(connection, batch_size)
            total += deleted
            if deleted:
                log.info("queue %s: purged %d expired message(s) (%d so far)",
                         table_queue.name, deleted, total)
            if deleted < batch_size:
                return total

    def purge_all(self, queue: QueueRef) -> int:
        """Delete every message of the queue; return how many."""
        table_queue = self.queues.table_queue(queue)
        with db.wrap_db_errors(table_queue.name), self.engine.begin() as connection:
            deleted = table_queue.purge_all(connection)
        log.info("queue %s: purged all %d message(s)", table_queue.name, deleted)
        return deleted

    def list_queues(self, schemas: Iterable[str | None] | None = None) -> list[tuple[str, int]]:
        """Queue tables found in *schemas* (default: the default schema), with estimated counts."""
        chosen = list(schemas) if schemas is not None else [self.default_schema]
        with db.wrap_db_errors(), db.reading(self.engine) as connection:
            found = self.queues.inspector.find_queue_tables(connection, chosen)
            return [
                (str(info.address), self.queues.table_queue(info.address).peek(connection))
                for info in found
            ]
