"""AsyncUnitOfWork: an ``AsyncSession`` and sends that commit together, for asyncio code.

::

    async with AsyncUnitOfWork(transport) as uow:           # connect and BEGIN
        uow.session.add(Order(id=7))                         # your models
        await uow.send("billing", OutgoingMessage(b"..."))   # same transaction
    # normal exit: flush, COMMIT; an exception or a cancellation: ROLLBACK, and it propagates

The unit is a :class:`~sqlqueue_orm.session.UnitOfWork` (its sends, its outbox records, its
de-duplication, its commit and rollback) opened on an asyncio connection: each step runs the
synchronous unit's own code through ``run_sync``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from types import TracebackType

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from sqlqueue_orm import addressing, db, exceptions, sqlalchemy_internals
from sqlqueue_orm.aio.transport import AsyncTransport, connecting
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.session import Outcome, SendMode, UnitOfWork


class AsyncUnitOfWork:
    """One asyncio connection, one transaction: an ``AsyncSession`` and sends that commit together.

    The arguments are :class:`~sqlqueue_orm.session.UnitOfWork`'s, with an
    :class:`~sqlqueue_orm.aio.transport.AsyncTransport`; *after_commit* is a plain (not
    ``async``) callable, called with this unit right after the commit.
    """

    # The arguments repeat UnitOfWork's on purpose: they are handed to it as they are
    # (tests/unit/test_async_public_api.py holds them equal).
    def __init__(
        self,
        transport: AsyncTransport,
        *,
        mode: SendMode = "direct",
        outbox: Outbox | None = None,
        incoming_message_id: str | None = None,
        after_commit: Callable[[AsyncUnitOfWork], object] | None = None,
        dispatch_inline: bool = True,
    ) -> None:
        if not isinstance(transport, AsyncTransport):
            raise exceptions.ConfigurationError(
                f"an asyncio unit of work needs an AsyncTransport, not {transport!r}"
            )
        self.transport = transport
        self._core = UnitOfWork(
            transport.transport,
            mode=mode,
            outbox=outbox,
            incoming_message_id=incoming_message_id,
            after_commit=None if after_commit is None else lambda _core: after_commit(self),
            dispatch_inline=dispatch_inline,
        )
        self._connection: AsyncConnection | None = None
        self._session: AsyncSession | None = None

    def __repr__(self) -> str:
        return repr(self._core).replace("<UnitOfWork", "<AsyncUnitOfWork", 1)

    # -- what the synchronous unit knows -----------------------------------------------------
    # One property per fact, alike on purpose: each reads the synchronous unit's own and is
    # documented here, where an asyncio user reads it.
    @property
    def mode(self) -> SendMode:
        """``"direct"`` or ``"outbox"``: how sends to queues of this database are made."""
        return self._core.mode

    @property
    def outcome(self) -> Outcome:
        """What de-duplication found (always RUN without an incoming message id)."""
        return self._core.outcome

    @property
    def already_handled(self) -> bool:
        """True when the incoming message was handled before: skip the work (nothing commits)."""
        return self._core.already_handled

    @property
    def sent(self) -> collections.Counter[str]:
        """Messages sent per queue address, by either mode."""
        return self._core.sent

    @property
    def record_id(self) -> str | None:
        """The outbox record stored at commit (None if nothing needed one)."""
        return self._core.record_id

    @property
    def committed(self) -> bool:
        """Whether the unit committed."""
        return self._core.committed

    @property
    def connection(self) -> AsyncConnection:
        """The unit's asyncio connection, in its transaction (for Core statements)."""
        if self._connection is None:
            raise exceptions.SqlQueueError(
                "the unit of work is not open: use it in an async with block"
            )
        return self._connection

    @property
    def session(self) -> AsyncSession:
        """The ``AsyncSession`` for your models, bound to the unit's connection and transaction.

        ``AsyncSession(bind=connection, join_transaction_mode="create_savepoint",
        expire_on_commit=False)``: its ``commit()`` inside the block only releases a savepoint.
        """
        if self._session is None:
            raise exceptions.SqlQueueError(
                "the unit of work is not open: use it in an async with block"
            )
        return self._session

    # -- sending -----------------------------------------------------------------------------
    async def send(
        self,
        destination: str | addressing.QueueAddress,
        message: OutgoingMessage,
        *,
        mode: SendMode | None = None,
    ) -> str:
        """Send *message* to *destination* in this unit's transaction; return its message id."""
        return (await self.send_many(destination, [message], mode=mode))[0]

    async def send_many(
        self,
        destination: str | addressing.QueueAddress,
        messages: Sequence[OutgoingMessage],
        *,
        mode: SendMode | None = None,
    ) -> list[str]:
        """Send *messages* in this unit's transaction (:meth:`UnitOfWork.send_many`)."""
        return await self.connection.run_sync(
            lambda _connection: self._core.send_many(destination, messages, mode=mode)
        )

    # -- async context manager ---------------------------------------------------------------
    async def __aenter__(self) -> AsyncUnitOfWork:
        # De-duplication first, on a connection of its own, as the synchronous unit does: none
        # is held meanwhile (SQLite: no write lock; the pool: one connection per unit at most).
        with connecting():
            await sqlalchemy_internals.greenlet_spawn(self._core.start)
            connection = await self.transport.engine.connect()
        try:
            with db.wrap_db_errors():
                transaction = await connection.begin()
            session = AsyncSession(
                bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
            )
            self._core.join(
                connection.sync_connection,  # type: ignore[arg-type]
                transaction.sync_transaction,  # type: ignore[arg-type]
                session.sync_session,
            )
        except BaseException:
            await connection.close()
            raise
        self._connection, self._session = connection, session
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        connection = self.connection
        try:
            # The synchronous unit's own ending: flush, outbox record, COMMIT (or ROLLBACK),
            # close, then the after-commit call and the inline dispatch.
            await connection.run_sync(
                lambda _connection: self._core.__exit__(exc_type, exc, traceback)
            )
        finally:
            self._connection = self._session = None
            await connection.close()  # already closed by the unit; a no-op then
