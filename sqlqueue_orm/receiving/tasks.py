"""The receive tasks the pump hands its workers, and the connection a worker keeps between them.

:class:`~sqlqueue_orm.receiving.pump.MessagePump` owns the loop and the stop; this module owns
what passes through one worker thread:

* :class:`Batch`: the receive tasks (tickets) started after one peek; the loop waits until each
  has run its receive, and one that found nothing cancels the rest.
* :data:`SHRUNK`: the ticket a shrink hands each worker too many, so an idle one ends at once
  (a busy one ends after its message without it).
* :class:`Worker`: one worker thread's state (a
  :class:`~sqlqueue_orm.receiving.worker.WorkerState`) with the connection it keeps. It keeps
  it (a :class:`~sqlqueue_orm.keeping.KeptConnection`) while receive tasks keep coming and
  gives it back after :data:`LINGER` without one (a checkout per message costs the unbatched
  pump much of its CPU), after :data:`~sqlqueue_orm.keeping.KEEP_MOST` receives, after a
  receive that raised, when a timed-out stop closed it, and in NONE before the handler when
  the pool has no room for the handler's own connections. Each take and each give-back is
  reported to the pump (``holding``): its stop waits for every one back.
* :class:`Receipt`: one receive, handed with its worker to the mode's ``process``; it reports
  to its batch whether the receive found a message, and a timed-out stop abandons it, closing
  its connection under it so the database rolls the receive back.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions
from sqlqueue_orm.keeping import KeptConnection
from sqlqueue_orm.receiving.worker import WorkerState
from sqlqueue_orm.transactions import KeptRoot

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from sqlqueue_orm import addressing
    from sqlqueue_orm.transactions import Transaction

__all__ = ["LINGER", "SHRUNK", "Batch", "Receipt", "Shrunk", "Worker"]

log = logging.getLogger(__name__)

#: Seconds a worker that finds no receive task waiting keeps its connection before giving it
#: back to the pool. Under load the loop hands out the next tasks a peek after the last was
#: taken (a millisecond or a few), and a connection given back there and checked out again
#: costs a checkin and a checkout, and, batched under a per-key limit, its key leases claimed
#: anew.
LINGER = 0.05


class Batch:
    """The receive tickets handed out after one peek."""

    def __init__(self, size: int) -> None:
        self._remaining = size
        self.empty = False
        self.done = threading.Event()
        self._lock = threading.Lock()
        if size <= 0:
            self.done.set()

    def mark(self, found: bool) -> None:
        """One ticket ran its receive (or was cancelled: *found* True); *found*: a message."""
        with self._lock:
            self._remaining -= 1
            if not found:
                self.empty = True
            if self._remaining <= 0:
                self.done.set()


class Shrunk:
    """A worker's ticket after a shrink: end if the pump has more workers than its concurrency.

    A worker that takes it when the busy ones already ended as many passes over it.
    """

    __slots__ = ()


#: The one :class:`Shrunk` ticket.
SHRUNK = Shrunk()


class Worker(WorkerState):
    """One worker thread's state, with the connection it keeps (see the module docstring).

    Used as the ``with`` block of one receive (:meth:`Receipt.connect`): on leaving it a
    transaction still open is rolled back, and after an exception, when the stop abandoned the
    receive, when the receive asked not to keep it (NONE, whose handler runs after the block on
    connections of its own, when the pool has no room for them) or after
    :data:`~sqlqueue_orm.keeping.KEEP_MOST` receives, the connection goes back to the pool.

    :param queue: the pumped queue (for the log).
    :param holding: told 1 when the worker takes a connection, -1 when it gives it back.
    """

    __slots__ = ("held", "holding", "keep", "kept", "queue", "receipt")

    def __init__(
        self, queue: str | addressing.QueueAddress, holding: Callable[[int], None]
    ) -> None:
        super().__init__()
        self.queue = queue
        self.holding = holding
        #: The connection kept between receives, or None.
        self.held: KeptConnection[Connection] | None = None
        #: The transactions of the kept connection (one SQLAlchemy transaction object).
        self.kept: KeptRoot | None = None
        self.receipt: Receipt | None = None
        self.keep = True

    @property
    def connection(self) -> Connection | None:
        """The connection the worker keeps now, or None."""
        held = self.held
        return None if held is None else held.connection

    def open(self, engine: Engine, receipt: Receipt, keep: bool) -> Worker:
        """Ready for *receipt*'s receive on *engine*: the kept connection, or a new one."""
        held = self.held
        if held is None:
            connection = None
        else:
            connection = held.connection
            if connection.closed or connection.invalidated or connection.engine is not engine:
                connection = None
        if connection is None:
            self.release()
            connection = engine.connect()
            self.holding(1)
            self.held = KeptConnection(connection, functools.partial(self.holding, -1))
            self.kept = KeptRoot(connection)
        self.receipt = receipt
        self.keep = keep
        receipt.connection = connection
        return self

    def __enter__(self) -> Connection:
        assert self.held is not None
        return self.held.connection

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        held = self.held
        receipt, self.receipt = self.receipt, None
        if receipt is not None:
            receipt.connection = None  # a stop abandoning it later must not close this one
        if held is None:
            return
        connection = held.connection
        if (
            held.used()
            or kind is not None
            or connection.invalidated
            or (receipt is not None and receipt.abandoned)
            or not self.keep
        ):
            self.release()  # (after a failure its state is not known: the next gets another)
        elif self.kept is not None and self.kept.open:
            self.kept.rollback()  # what closing it would have done
        elif connection.in_transaction() and (
            self.kept is None or connection.get_transaction() is not self.kept.root
        ):
            connection.rollback()  # one the receive began itself

    def release(self) -> None:
        """Give the connection back to the pool (idle, stopping, or after a failure)."""
        held, self.held = self.held, None
        self.kept = None
        if held is not None:
            try:
                held.close()  # then tells the pump it is back
            except Exception as error:  # already broken: the pool discards it
                log.debug("queue %s: closing a worker's connection: %s", self.queue, error)


@dataclasses.dataclass(eq=False, slots=True)
class Receipt:
    """One worker's receive: reports to the batch, can be abandoned by a timed-out stop.

    It is in flight from a receive that took a message (or a batch) until its first outcome
    is counted, it is abandoned or it ends; a receive that finds nothing never is.

    :param batch: the receive tasks it is one of, told whether it found a message.
    :param worker: the worker running it, with the connection it keeps.
    :param counted: ``counted(outcome, count, in_flight)`` counts *count* messages of
        *outcome* (None: none) and changes the pump's in flight by *in_flight* (1, 0 or -1),
        both at once.
    """

    batch: Batch
    worker: Worker
    counted: Callable[[str | None, int, int], None]
    #: The worker's connection while it runs this receive (set and cleared by the
    #: worker), which :meth:`abandon` closes.
    connection: Connection | None = dataclasses.field(default=None, init=False)
    abandoned: bool = dataclasses.field(default=False, init=False)
    #: Whether the receive took a message.
    found: bool = dataclasses.field(default=False, init=False)
    #: Whether its row is still held: taken, the receive's transaction not committed
    #: (NONE commits before the handler runs; a rollback ends with the receipt).
    holding: bool = dataclasses.field(default=False, init=False)
    _signalled: bool = dataclasses.field(default=False, init=False)
    _flying: bool = dataclasses.field(default=False, init=False)
    #: A stop's abandon and the worker end its time in flight once.
    _landing: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)

    def received(self, found: bool) -> None:
        """The receive ran: *found* whether it took a message (only the first call counts)."""
        if not self._signalled:
            self._signalled = True
            self.found = self.holding = found
            if found:
                self._flying = True
                self.counted(None, 0, 1)
            self.batch.mark(found)

    def connect(self, engine: Engine, keep: bool = True) -> Worker:
        """The receive's connection (the worker's, kept unless *keep* is False), for ``with``."""
        return self.worker.open(engine, self, keep)

    def begin(self, connection: Connection) -> Transaction:
        """Begin the receive's transaction on *connection* (the worker's, from :meth:`connect`).

        The worker keeps SQLAlchemy's transaction object open on its kept connection from
        one receive to the next (:class:`~sqlqueue_orm.transactions.KeptRoot`).
        """
        kept = self.worker.kept
        if kept is None or kept.connection is not connection:
            return connection.begin()
        return kept.begin()

    def commit(self, transaction: Transaction) -> None:
        """Commit the receive's *transaction*, unless a timed-out stop abandoned it."""
        if self.abandoned:
            raise exceptions.SqlQueueError("abandoned by a timed-out stop; rolled back")
        transaction.commit()
        self.holding = False

    def outcome(self, name: str, count: int = 1) -> None:
        """Count *count* messages of outcome *name* (the first one ends its time in flight)."""
        self.counted(name, count, -1 if self._land() else 0)

    def settle(self) -> None:
        """No longer in flight (it ended, or was abandoned), whatever it counted."""
        if self._land():
            self.counted(None, 0, -1)

    def _land(self) -> bool:
        """End its time in flight; return whether it was in flight until now."""
        with self._landing:
            flying, self._flying = self._flying, False
        return flying

    def abandon(self) -> None:
        """Close the connection under the receive (a timed-out stop): the server rolls back."""
        self.abandoned = True
        self.settle()  # its messages return to the queue
        connection = self.connection
        if connection is not None:
            try:
                connection.invalidate()  # closes the DBAPI connection: the server rolls back
            except Exception as error:  # the worker may be using it this very moment
                log.debug(
                    "queue %s: closing an abandoned connection: %s", self.worker.queue, error
                )
