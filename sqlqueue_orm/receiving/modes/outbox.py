"""Mode OUTBOX: a RECEIVE_ONLY receive; handlers in a de-duplicated unit of work with the outbox."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions
from sqlqueue_orm.receiving.modes.native import NativeTransaction
from sqlqueue_orm.receiving.settings import TransactionMode
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.session import UnitOfWork

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState

log = logging.getLogger(__name__)


class OutboxMode(NativeTransaction):
    """OUTBOX: RECEIVE_ONLY receive, handlers in a de-duplicated unit of work with the outbox."""

    mode = TransactionMode.OUTBOX

    @functools.cached_property
    def outbox(self) -> Outbox:
        """The outbox of the handlers' unit of work: the endpoint's, else one of its own.

        Made on first use, by :meth:`prepare` at start-up.
        """
        handling = self.handling
        return handling.outbox or Outbox(handling.user_transport)

    def prepare(self) -> None:
        """Create the outbox table if it is missing."""
        super().prepare()
        if self.settings.create_queues:
            self.outbox.create_table()

    def _handle(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> None:
        unit = UnitOfWork(
            self.handling.user_transport,
            mode="outbox",
            outbox=self.outbox,
            incoming_message_id=message.message_id,
        )
        try:
            with unit:
                if unit.already_handled:
                    log.info(
                        "queue %s: message %s was handled before; not handling it again",
                        self.queue,
                        message.message_id,
                    )
                    return
                context = self._context(
                    message,
                    lambda destination, outgoing: unit.send(destination, outgoing),
                    lambda: unit.session,
                )
                self.handling.invoke(context)
        except exceptions.DuplicateMessage:
            log.info(
                "queue %s: message %s was handled concurrently elsewhere; not again",
                self.queue,
                message.message_id,
            )
