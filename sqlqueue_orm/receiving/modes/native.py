"""The modes whose receive's transaction spans the handling, batched or not.

Their receive is :meth:`ReceiveMode._process <sqlqueue_orm.receiving.modes.base.ReceiveMode>`
(one message) or :mod:`~sqlqueue_orm.receiving.modes.batching` (``batch_size`` above 1); the
subclasses say how the handlers' sends and session go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm.receiving.modes.batching import BatchHandler, BatchingMode

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
