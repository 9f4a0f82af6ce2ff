"""The receiver: how an endpoint's workers take messages off its queue, chosen at start-up.

A transaction mode (:mod:`sqlqueue_orm.receiving.modes`) calls its receiver at four points of
each receive, passing the worker's :class:`~sqlqueue_orm.receiving.worker.WorkerState`:

* :meth:`Receiver.enter` before the receive's transaction begins (False: skip this receive);
* :meth:`Receiver.receive` in the transaction, once or (a batch) more;
* :meth:`Receiver.paced` after a single message was taken (False: put it back);
* :meth:`Receiver.leave` when the receive is over, whatever became of it.

:class:`Receiver` itself is the plain receive; the limits of :mod:`sqlqueue_orm.receiving.flow`
are receivers too, the rate limit wrapping any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState
    from sqlqueue_orm.transport import Transport


class Receiver:
    """The plain receive: up to *count* of the oldest messages no other receiver holds.

    :param transport: the queue's transport.
    :param queue: the queue received from.
    """

    def __init__(self, transport: Transport, queue: str | addressing.QueueAddress) -> None:
        self.transport = transport
        self.queue = queue

    def prepare(self) -> None:
        """Create what the receiver needs at start-up (nothing here)."""

    def enter(self, worker: WorkerState) -> bool:
        """Before the receive's transaction: whether to receive at all (here always)."""
        return True

    def receive(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """Take up to *count* messages in *connection*'s transaction."""
        return self.transport.receive(self.queue, count, connection=connection)

    def paced(self, worker: WorkerState) -> bool:
        """One message was taken (not batched): whether its handlers may start now."""
        return True

    def leave(self, worker: WorkerState) -> None:
        """The receive is over (committed, rolled back, or failed)."""
