"""Mode RECEIVE_ONLY: the message returns on failure; sends leave at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm.receiving.modes.native import NativeTransaction
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState


# Same shape as the other modes' modules on purpose: each mode is a class of its own that
# sets ``mode`` and overrides ``_handle``; what they share lives in NativeTransaction.
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
