"""One message's handling inside the receive's transaction: its SAVEPOINT and its sends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, NestedTransaction

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import OutgoingMessage
    from sqlqueue_orm.transport import Transport


class MessageScope:
    """One message's handling inside the receive's transaction: its SAVEPOINT and its sends.

    The SAVEPOINT opens when the handlers first reach the database: the session, a send, a
    defer (:attr:`connection`) or the audit copy open it first. A handler that touches none of
    them needs none: if it fails, nothing of it is in the transaction to roll back. So a
    message (or a batch) whose handlers write nothing is BEGIN, one receive, COMMIT.

    It is also the handlers' sender: each send goes out on the receive's connection and its
    destination is appended to :attr:`sent` (a batch's scopes share one list), to wake them
    after the commit; a rollback drops what this scope appended.
    """

    __slots__ = ("_connection", "_mark", "_transaction", "_transport", "sent")

    def __init__(
        self,
        transport: Transport,
        connection: Connection,
        sent: list[str | addressing.QueueAddress] | None = None,
    ) -> None:
        self._transport = transport
        self._connection = connection
        self._transaction: NestedTransaction | None = None
        #: The destinations sent to, in order (shared with the batch's other messages).
        self.sent: list[str | addressing.QueueAddress] = [] if sent is None else sent
        self._mark = len(self.sent)

    @property
    def opened(self) -> bool:
        """Whether the handlers reached the database (a send, the session, a defer).

        A scope not opened holds nothing: the next message of a batch may use it.
        """
        return self._transaction is not None

    def open(self) -> None:
        """Open the SAVEPOINT unless it is open already."""
        if self._transaction is None:
            self._transaction = self._connection.begin_nested()

    def rollback(self) -> None:
        """Roll back what the handler wrote (nothing to do if it wrote nothing)."""
        del self.sent[self._mark :]
        transaction = self._transaction
        if transaction is not None and transaction.is_active:
            # close() rolls back to the SAVEPOINT as rollback() does, without SQLAlchemy's
            # warning when a failed inner one (the handler's session's, the connection lost
            # mid-statement) is still the connection's current nested transaction
            transaction.close()

    def session(self) -> Session:
        """An ORM session in the receive's transaction, inside this SAVEPOINT (opened first)."""
        self.open()
        return Session(
            bind=self._connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )

    def deferred_session(self) -> Session:
        """:meth:`session`, its SAVEPOINT opened when the session first reaches the database.

        Made without a statement (the asyncio endpoint makes it where none can run).
        """
        return _DeferredSession(self)

    def release(self) -> None:
        """Keep what the handler wrote in the receive's transaction."""
        transaction = self._transaction
        if transaction is not None and transaction.is_active:
            transaction.commit()

    @property
    def connection(self) -> Connection:
        """The receive's connection, the SAVEPOINT open (:meth:`HandlerContext.defer`)."""
        self.open()
        return self._connection

    def __call__(
        self, destination: str | addressing.QueueAddress, outgoing: OutgoingMessage
    ) -> str:
        """Send *outgoing* to *destination* in the receive's transaction."""
        message_id = self._transport.send(destination, outgoing, connection=self.connection)
        self.sent.append(destination)
        return message_id


class _DeferredSession(Session):
    """A :meth:`MessageScope.session` that opens the scope's SAVEPOINT on first use.

    The session asks for its bind before it reaches the database (a query, a flush): the
    scope's SAVEPOINT opens there, before the session's own, as :meth:`MessageScope.session`
    opens it before making the session.
    """

    def __init__(self, scope: MessageScope) -> None:
        super().__init__(
            bind=scope._connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        self._scope = scope

    def get_bind(self, *args: Any, **kwargs: Any) -> Any:
        """The receive's connection, the scope's SAVEPOINT opened first."""
        self._scope.open()
        return super().get_bind(*args, **kwargs)
