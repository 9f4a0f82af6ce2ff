"""Mode TRANSACTION_SCOPE: the receive, the session and the sends are one transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm.receiving.handling import ScopedContext
from sqlqueue_orm.receiving.modes.native import NativeTransaction
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.modes.batching import BatchHandler
    from sqlqueue_orm.receiving.scope import MessageScope
    from sqlqueue_orm.receiving.worker import WorkerState


class TransactionScope(NativeTransaction):
    """TRANSACTION_SCOPE: the receive, the session and the sends are one transaction."""

    mode = TransactionMode.TRANSACTION_SCOPE

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        self._handle_scoped(
            worker, connection, message, self._transactional_sender(worker, connection)
        )

    # Same signature as ReceiveMode._handle_scoped, which it overrides: here the scope is
    # the sender and the batch's handler runs the message.
    def _handle_scoped(
        self,
        worker: WorkerState,
        connection: Connection,
        message: IncomingMessage,
        scope: MessageScope,
    ) -> None:
        self.batch_handler(worker)(connection, message, scope)

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
