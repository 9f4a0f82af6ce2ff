"""The modes whose receive's transaction spans the handling: one message at a time, or a batch.

Mode NONE aside, every mode receives in a transaction, handles the message inside a SAVEPOINT
(opened when its handlers first reach the database) and commits, retries or moves it; its
subclasses say how the handlers' sends and session go. With ``batch_size`` above 1 the
transaction takes a batch instead (:mod:`~sqlqueue_orm.receiving.modes.batching`).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlqueue_orm.receiving.modes.base import Receipt
from sqlqueue_orm.receiving.modes.batching import BatchHandler, BatchingMode
from sqlqueue_orm.receiving.scope import MessageScope

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState


class NativeTransaction(BatchingMode):
    """The receive's transaction spans the handling; subclasses say how sends and sessions go."""

    def _process(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive in a transaction, handle inside a SAVEPOINT, commit or retry or move."""
        if self.settings.batch_size > 1:
            self._process_batch(receipt, worker)
            return
        receiver = self.receiver
        with receipt.connect(self.transport.engine) as connection:
            transaction = connection.begin()
            messages = receiver.receive(worker, connection, 1)
            receipt.received(bool(messages))
            if not messages or not receiver.paced(worker):
                self._nothing_handled(transaction, messages)
                return
            message = messages[0]
            if message.expired:
                self._discard_expired(message)
                receipt.commit(transaction)
                receipt.outcome("expired")
                return
            if message.headers_error is not None:
                self._dead_letter(connection, message)
                receipt.commit(transaction)
                receipt.outcome("poison")
                return
            local = self._forward_delayed(worker, connection, message)
            if local is None:
                receipt.commit(transaction)
                self._wake_forwarded(worker)
                receipt.outcome("handled")
                return
            message = local
            started = dt.datetime.now(dt.UTC) if self.settings.audit_queue is not None else None
            # opened when the handlers first reach the database, as in a batch: handlers that
            # write nothing cost no SAVEPOINT round trips
            scope = MessageScope(self.transport, connection)
            try:
                self._handle_scoped(worker, connection, message, scope)
                if started is not None:
                    scope.open()
                    self._audit(connection, message, started)  # in the receive's transaction
            except Exception as error:
                outcome = self._failed(connection, message, scope, error, in_batch=False)
                if outcome == "retried":
                    transaction.rollback()
                    self._returned(message)  # retried at once, so found at once
                else:  # delayed or failed: its retry or error-queue row commits with the receive
                    receipt.commit(transaction)
                    self.failures.forget(str(message.id))  # once committed: gone from here
                receipt.outcome(outcome)
                return
            scope.release()
            receipt.commit(transaction)
            self._wake_destinations(scope.sent)
            self.failures.forget(str(message.id))
            receipt.outcome("handled")

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        """Run the handlers of *message* as the mode says (its sends, its session)."""
        raise NotImplementedError

    def _handle_scoped(
        self,
        worker: WorkerState,
        connection: Connection,
        message: IncomingMessage,
        scope: MessageScope,
    ) -> None:
        """Run the handlers of a message in *scope* (its SAVEPOINT opened on their first write)."""
        worker.scope = scope
        try:
            self._handle(worker, connection, message)
        finally:
            worker.scope = None

    def batch_handler(self, worker: WorkerState) -> BatchHandler:
        """What runs a batched message's handlers in its scope (one lookup per batch)."""

        def handle(connection: Connection, message: IncomingMessage, scope: MessageScope) -> None:
            self._handle_scoped(worker, connection, message, scope)

        return handle
