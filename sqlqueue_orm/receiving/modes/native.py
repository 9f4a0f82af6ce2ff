"""The modes that use the receive's native transaction: it spans the handling, batched or not.

Their receive is :meth:`ReceiveMode._process <sqlqueue_orm.receiving.modes.base.ReceiveMode>`
(one message) or :mod:`~sqlqueue_orm.receiving.modes.batching` (``batch_size`` above 1); each
mode here says how the handlers' sends and session go. OUTBOX, which also takes this receive,
has its own module (:mod:`~sqlqueue_orm.receiving.modes.outbox`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm.receiving.handling import ScopedContext
from sqlqueue_orm.receiving.modes.batching import BatchHandler, BatchingMode
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.scope import MessageScope
    from sqlqueue_orm.receiving.worker import WorkerState


class NativeTransaction(BatchingMode):
    """The receive's transaction spans the handling; subclasses say how sends and sessions go."""

    def batch_handler(self, worker: WorkerState) -> BatchHandler:
        """What runs a batched message's handlers in its scope (one lookup per batch)."""

        def handle(connection: Connection, message: IncomingMessage, scope: MessageScope) -> None:
            self._handle_scoped(worker, connection, message, scope)

        return handle


class ReceiveOnly(NativeTransaction):
    """RECEIVE_ONLY: the message returns on failure; sends leave at once (ghosts on failure)."""

    mode = TransactionMode.RECEIVE_ONLY

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        transport = self.transport
        self._run_with_own_session(
            message, lambda destination, outgoing: transport.send(destination, outgoing)
        )


class SendsAtomicWithReceive(NativeTransaction):
    """SENDS_ATOMIC_WITH_RECEIVE: sends in the receive's transaction; the session apart."""

    mode = TransactionMode.SENDS_ATOMIC_WITH_RECEIVE

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        self._run_with_own_session(message, self._transactional_sender(worker, connection))


class TransactionScope(NativeTransaction):
    """TRANSACTION_SCOPE: the receive, the session and the sends are one transaction."""

    mode = TransactionMode.TRANSACTION_SCOPE

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        # the message's scope is the sender; the batch's handler runs the message
        self.batch_handler(worker)(
            connection, message, self._transactional_sender(worker, connection)
        )

    def batch_handler(self, worker: WorkerState) -> BatchHandler:
        """Invoke the handlers; commit the session's SAVEPOINT if they used it (tx stays open).

        The hot path of a batch: the scope is the sender and makes the session, and the
        handler dispatch is looked up once per batch.
        """
        handling = self.handling
        invoke = handling.invoker()

        def handle(connection: Connection, message: IncomingMessage, scope: MessageScope) -> None:
            context = ScopedContext(handling, message, scope)
            try:
                invoke(context)
            except BaseException:
                used = context.session_used
                if used is not None:
                    used.close()
                raise
            used = context.session_used
            if used is not None:
                try:
                    used.commit()  # flushes, releases its SAVEPOINT; tx stays open
                finally:
                    used.close()

        return handle
