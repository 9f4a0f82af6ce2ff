"""Mode SENDS_ATOMIC_WITH_RECEIVE: sends in the receive's transaction; the session apart."""

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
class SendsAtomicWithReceive(NativeTransaction):
    """SENDS_ATOMIC_WITH_RECEIVE: sends in the receive's transaction; the session apart."""

    mode = TransactionMode.SENDS_ATOMIC_WITH_RECEIVE

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        self._run_with_own_session(message, self._transactional_sender(worker, connection))
