"""Mode NONE: the receive commits first; a crash during handling loses the message.

On a database with one write lock (SQLite) whose file the handlers' session writes too, the
session's transaction holds that lock from its first statement (a read is enough: every
transaction begins ``BEGIN IMMEDIATE``) until it commits after the handlers. A send on another
connection meanwhile would wait for it, in vain, and fail. So there a send made while the
session's transaction is open goes out in it (:class:`SessionSender`) and commits with the data;
a send made before the session reached the database leaves at once, as elsewhere.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from sqlqueue_orm import connections, dialects
from sqlqueue_orm.receiving.modes.base import Receipt, ReceiveMode, same_database
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.orm import SessionTransaction

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import OutgoingMessage
    from sqlqueue_orm.receiving.worker import WorkerState
    from sqlqueue_orm.transport import Transport


class SessionSender:
    """NONE's sender and session maker where the session holds the only write lock (SQLite).

    While the session's transaction is open, a send (a reply, a publish, a defer) runs on its
    connection, in that transaction; otherwise it leaves at once on a connection of the
    transport's. :attr:`sent` lists the destinations sent in the session's transaction, to wake
    after it commits.
    """

    __slots__ = ("_connection", "_engine", "_transport", "sent")

    def __init__(self, transport: Transport, engine: Engine) -> None:
        self._transport = transport
        self._engine = engine
        self._connection: Connection | None = None
        #: The destinations sent to in the session's transaction, in order.
        self.sent: list[str | addressing.QueueAddress] = []

    def session(self) -> Session:
        """The handlers' session, its transaction's connection followed."""
        session = Session(bind=self._engine, expire_on_commit=False)
        event.listen(session, "after_begin", self._began)
        event.listen(session, "after_transaction_end", self._ended)
        return session

    def _began(self, _session: Session, _transaction: Any, connection: Connection) -> None:
        self._connection = connection

    def _ended(self, _session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # the session's own transaction, not a SAVEPOINT
            self._connection = None

    @property
    def connection(self) -> Connection | None:
        """The session's connection while its transaction is open (``HandlerContext.defer``)."""
        return self._connection

    def __call__(
        self, destination: str | addressing.QueueAddress, outgoing: OutgoingMessage
    ) -> str:
        """Send *outgoing* in the session's transaction if it is open, else at once."""
        connection = self._connection
        if connection is None:
            return self._transport.send(destination, outgoing)
        message_id = self._transport.send(destination, outgoing, connection=connection)
        self.sent.append(destination)
        return message_id


class NoTransaction(ReceiveMode):
    """NONE: the receive commits first; a crash during handling loses the message.

    A handler failure sends the message to the error queue (no retries: it is no longer in the
    input queue). The handlers' session commits after them; their sends leave at once (on one
    write lock shared with the session: see the module's docstring).
    """

    mode = TransactionMode.NONE

    @functools.cached_property
    def _share_lock(self) -> bool:
        """Whether sends share the session's transaction (its file's only write lock)."""
        handling = self.handling
        return dialects.for_dialect(handling.transport.engine).single_writer and same_database(
            handling
        )

    def _process(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive (committed), then handle outside any transaction of the queue."""
        transport = self.transport
        # The handler runs after the block, its session and its sends on connections of their
        # own: the worker keeps its (idle) connection through it only while the pool has room
        # for those two, so they do not wait for one the worker sits on.
        keep = connections.pool_has_room(transport.engine, 2)
        with receipt.connect(transport.engine, keep=keep) as connection:
            transaction = receipt.begin(connection)
            messages = self.receiver.receive(worker, connection, 1)
            receipt.received(bool(messages))
            if not messages or not self.receiver.paced(worker):
                self._nothing_handled(transaction, messages)
                return
            message = messages[0]
            if self._poison(receipt, connection, transaction, message):
                return
            local = self._forward_delayed(worker, connection, message)
            receipt.commit(transaction)  # the message is gone from here on
            if local is None:
                self._wake_forwarded(worker)
                receipt.outcome("handled")
                return
            message = local
        if message.expired:
            self._discard_expired(message)
            receipt.outcome("expired")
            return
        started = dt.datetime.now(dt.UTC)
        user_engine = self.handling.user_transport.engine
        shared = SessionSender(transport, user_engine) if self._share_lock else None
        if shared is not None:
            context = self._context(message, shared, shared.session)
        else:
            context = self._context(
                message,
                lambda destination, outgoing: transport.send(destination, outgoing),
                lambda: Session(bind=user_engine, expire_on_commit=False),
            )
        try:
            self.handling.invoke(context)
            if context.session_used is not None:
                context.session_used.commit()
        except Exception as error:
            if context.session_used is not None:
                context.session_used.rollback()
            receipt.outcome("failed")
            self._to_error_queue(None, message, error)
            return
        finally:
            if context.session_used is not None:
                context.session_used.close()
        if shared is not None:  # what went out with the session's commit
            self._wake_destinations(shared.sent)
        self._audit(None, message, started)
        receipt.outcome("handled")
