"""The global concurrency limit: at most K messages of a queue in flight across processes.

``EndpointSettings(global_concurrency=K)``: at most K messages of the queue are handled at once,
counted across every process and every endpoint instance receiving from it with the same limit.
Its state lives in locks (:mod:`~sqlqueue_orm.receiving.flow.slots`), never in a column of the
queue table (which .NET endpoints share):

* **PostgreSQL**: K transaction-scoped advisory locks, ``(hashtext('sqlqueue.slots.' ||
  <queue address>), 0..K-1)``. The receive claims one in its own statement (the dialect's
  ``receive_gated``; with a per-key limit, ``receive_claiming``); when that is refused the rows
  go back and, for :data:`~sqlqueue_orm.receiving.flow.slots.REFUSAL_PAUSE` seconds, the
  worker claims in a statement of its own before it receives, so a limit that binds touches no
  row it cannot keep.
* **SQL Server**: the same with ``sp_getapplock`` (``@LockOwner = 'Transaction'``, no wait) on
  K resources named after a SHA-256 of the queue address; always claimed before the receive.
* **SQLite**: one process only (the database has no shared locks to hold): a semaphore of K
  per database file and queue, shared by the endpoints of this process.

A worker that finds every slot taken keeps its transaction open without locks and tries again
every 5 to 20 ms for up to :data:`~sqlqueue_orm.receiving.flow.slots.SLOT_WAIT` seconds, then
gives up (the pump peeks again). The limit needs a mode whose transaction spans the handling:
NONE is refused on PostgreSQL and SQL Server.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from sqlqueue_orm import dialects, sqlalchemy_internals
from sqlqueue_orm.receiving.flow import local, slots
from sqlqueue_orm.receiving.modes.base import Receiver

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)


class GlobalConcurrency(Receiver):
    """At most *limit* messages of one queue in flight across processes (module docstring).

    :param transport: the queue's transport.
    :param queue: the queue received from (its address names the locks).
    :param limit: slots.
    """

    def __init__(
        self, transport: Transport, queue: str | addressing.QueueAddress, limit: int
    ) -> None:
        super().__init__(transport, queue)
        engine = transport.engine
        #: The queue's address as text (what the lock names are made of).
        self.name = transport.address_text(queue)
        self.limit = limit
        statements = dialects.for_dialect(engine).flow
        #: Whether the slots are this process's alone (no locks shared between processes).
        self.local = statements is None
        self._semaphore = local.semaphore(engine, self.name, limit) if self.local else None
        self._statement = None if statements is None else statements.claim_slot
        #: Whether the receive can take the slot with the rows (PostgreSQL).
        self._gated = statements is not None and statements.receive_gated is not None
        #: Until when (monotonic) :meth:`claim` runs first instead (a refusal was recent).
        self._claim_first_until = 0.0

    @property
    def lock_name(self) -> str:
        """The name the slots' locks are made of."""
        return slots.LOCK_PREFIX + self.name

    def enter(self, worker: WorkerState) -> bool:
        """SQLite: take a slot of this process (wait up to ``SLOT_WAIT``); else True."""
        if self._semaphore is None:
            return True
        # a task of the event loop holding a slot across its handler runs on while another waits
        return sqlalchemy_internals.acquire(self._semaphore, timeout=slots.SLOT_WAIT)

    def leave(self, worker: WorkerState) -> None:
        """SQLite: give the slot :meth:`enter` took back."""
        if self._semaphore is not None:
            self._semaphore.release()

    @property
    def receives(self) -> bool:
        """Whether the receive takes the slot itself (no :meth:`claim` first).

        PostgreSQL, while no one-statement receive was refused in the last ``REFUSAL_PAUSE``
        seconds.
        """
        return self._gated and time.monotonic() >= self._claim_first_until

    def receive(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """The transaction's first receive takes a slot too: in its statement, or claimed first."""
        if not worker.fresh:
            return Receiver.receive(self, worker, connection, count)
        worker.fresh = False  # a later receive of this batch holds the slot already
        if self.receives:
            return self.receive_gated(worker, connection, count)
        if not self.claim(worker, connection):
            return []
        return Receiver.receive(self, worker, connection, count)

    def receive_gated(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """Take up to *count* messages and a slot in one statement (the dialect's receive_gated).

        Refused (every slot held): the rows go back, the slot is claimed on its own as
        :meth:`claim` does (waiting up to ``SLOT_WAIT``), and then the plain receive runs; for
        ``REFUSAL_PAUSE`` seconds :attr:`receives` is False, so the worker claims first.
        """
        values = {
            "gname": self.lock_name,
            "gk": self.limit,
            "first": slots.first_slot(worker, self.limit),
        }
        taken, columns = slots.claiming_receive(
            self.transport, self.table_queue, connection, count, False, values
        )
        if not taken or columns[0][0]:  # nothing taken, or the slot claimed
            return taken
        self._claim_first_until = time.monotonic() + slots.REFUSAL_PAUSE
        slots.put_back(self.transport, self.queue, connection, taken)
        if not self.claim(worker, connection):
            return []
        return Receiver.receive(self, worker, connection, count)

    def claim(self, worker: WorkerState, connection: Connection) -> bool:
        """Take a free slot for the life of *connection*'s transaction; False if none came."""
        if self._statement is None:
            return True
        deadline = time.monotonic() + slots.SLOT_WAIT
        while True:
            if slots.try_slot(worker, connection, self._statement, self.limit, self.lock_name):
                return True
            if time.monotonic() >= deadline:
                log.debug(
                    "queue %s: all %d global slots busy for %.1f s",
                    self.name,
                    self.limit,
                    slots.SLOT_WAIT,
                )
                return False
            sqlalchemy_internals.sleep(random.uniform(0.005, 0.02))  # noqa: S311  (jitter, not secrets)
