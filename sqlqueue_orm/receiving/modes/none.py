"""Mode NONE: the receive commits first; a crash during handling loses the message."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from sqlqueue_orm.receiving.modes.base import Receipt, ReceiveMode
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlqueue_orm.receiving.worker import WorkerState


class NoTransaction(ReceiveMode):
    """NONE: the receive commits first; a crash during handling loses the message.

    A handler failure sends the message to the error queue (no retries: it is no longer in the
    input queue). The handlers' session commits after them; their sends leave at once.
    """

    mode = TransactionMode.NONE

    def _process(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive (committed), then handle outside any transaction of the queue."""
        transport = self.transport
        # not kept: the handler runs after the block, and must not find it checked out still
        with receipt.connect(transport.engine, keep=False) as connection:
            transaction = connection.begin()
            messages = self.receiver.receive(worker, connection, 1)
            receipt.received(bool(messages))
            if not messages or not self.receiver.paced(worker):
                self._nothing_handled(transaction, messages)
                return
            message = messages[0]
            if message.headers_error is not None:
                self._dead_letter(connection, message)
                receipt.commit(transaction)
                receipt.outcome("poison")
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
        self._audit(None, message, started)
        receipt.outcome("handled")
