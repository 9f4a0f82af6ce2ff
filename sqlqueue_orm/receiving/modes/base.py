"""What every transaction mode does alike: the mode, its receiver, and the pump's receipt.

Each mode takes one message (or a batch) off the queue through its :class:`Receiver` (the plain
receive here; the limits of :mod:`sqlqueue_orm.receiving.flow` are receivers too) and runs the
endpoint's handlers on it, with the receive, the handlers' ORM session and their sends tied
together as its mode says. :meth:`ReceiveMode._process` is the receive of the modes whose
transaction spans the handling (NONE has its own). What they share:

* an expired message is discarded (the receive commits) without running a handler;
* a poison row (headers, or an Id, Body or Expires, that cannot be read) is moved to the error
  queue as it is stored, in the receive's transaction, as NServiceBus's ``DeadLetter`` does;
* a handler failure rolls back the handlers' work (a SAVEPOINT around it, opened when the
  handlers first reach the database: handlers that write nothing need none); the message is
  retried at once up to ``immediate_retries`` times (the receive rolls back, so it returns to
  its place), then moved to the error queue with NServiceBus's exception headers, in the
  receive's transaction. A message no handler accepts, or whose body its model cannot read, is
  moved at once (a retry cannot help). Mode NONE has taken the message already: it goes to
  the error queue at once, in a transaction of its own.
* a handled message is copied to the audit queue, if the settings name one, in the receive's
  transaction (mode NONE: after the handlers, in one of its own).

What the error-queue and audit rows hold is in :mod:`sqlqueue_orm.receiving.forwarding`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, ClassVar, Protocol

from sqlalchemy.orm import Session

from sqlqueue_orm import exceptions
from sqlqueue_orm.receiving import failure_entries, forwarding, retries
from sqlqueue_orm.receiving.failure_counts import FailureCounts
from sqlqueue_orm.receiving.scope import MessageScope

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.handling import HandlerContext, Handling, Sender
    from sqlqueue_orm.receiving.settings import TransactionMode
    from sqlqueue_orm.receiving.worker import WorkerState
    from sqlqueue_orm.transactions import Transaction
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)


class Receipt(Protocol):
    """What the pump gives a mode for one receive (see :class:`pump.MessagePump`)."""

    def received(self, found: bool) -> None:
        """Tell the pump the receive has run and whether it found a message."""

    def connect(self, engine: Engine, keep: bool = True) -> AbstractContextManager[Connection]:
        """The connection of this receive, for a ``with`` block.

        The pump's is the worker's connection, kept while receives keep coming (unless *keep*
        is False: given back when the block ends), which a timed-out stop can close; the block
        rolls back what it left open.
        """

    def begin(self, connection: Connection) -> Transaction:
        """Begin the receive's transaction on *connection* (the one :meth:`connect` gave)."""

    def commit(self, transaction: Transaction) -> None:
        """Commit the receive unless the stop abandoned this message (then roll back)."""

    def outcome(self, name: str, count: int = 1) -> None:
        """Count what became of *count* messages: handled, failed, retried, expired, poison."""


def same_database(handling: Handling) -> bool:
    """Whether the handlers' session writes to the database of the endpoint's queues."""
    mine, theirs = handling.transport.engine, handling.user_transport.engine
    return mine is theirs or str(mine.url) == str(theirs.url)


def is_permanent(error: BaseException) -> bool:
    """Failures a retry cannot fix: no handler, or a body the model cannot read."""
    if isinstance(error, exceptions.UnknownMessageType):
        return True
    return any(
        cls.__name__ == "ValidationError" and cls.__module__.startswith("pydantic")
        for cls in type(error).__mro__
    )


class Receiver:
    """How a mode takes messages off its queue, chosen once at start-up: here the plain receive.

    A mode calls its receiver at four points of each receive, passing the worker's state:
    :meth:`enter` before the receive's transaction begins (False: skip this receive),
    :meth:`receive` in the transaction (once, or more for a batch), :meth:`paced` after a
    single message was taken (False: put it back), and :meth:`leave` when the receive is over,
    whatever became of it. The limits (:mod:`sqlqueue_orm.receiving.flow`) override them.

    :param transport: the queue's transport.
    :param queue: the queue received from.
    """

    def __init__(self, transport: Transport, queue: str | addressing.QueueAddress) -> None:
        self.transport = transport
        self.queue = queue
        #: The queue's table, resolved once here: every receive runs its statements.
        self.table_queue = transport.queues.table_queue(queue)
        self._first_use = transport.queues.first_use

    def prepare(self) -> None:
        """Create what the receiver needs at start-up (nothing here)."""

    def enter(self, worker: WorkerState) -> bool:
        """Before the receive's transaction: whether to receive at all (here always)."""
        return True

    def receive(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """Take up to *count* of the oldest messages no other receiver holds, in the transaction.

        As :meth:`Transport.receive` with a connection: the queue's one-time checks first,
        and through the transport's instrumentation when there is one.
        """
        table_queue = self.table_queue
        self._first_use(connection, table_queue)
        instrumentation = self.transport.instrumentation
        if instrumentation is not None:
            return instrumentation.receive(
                table_queue.name, lambda: table_queue.receive(connection, count)
            )
        return table_queue.receive(connection, count)

    def paced(self, worker: WorkerState) -> bool:
        """One message was taken (not batched): whether its handlers may start now."""
        return True

    def leave(self, worker: WorkerState) -> None:
        """The receive is over (committed, rolled back, or failed)."""


class ReceiveMode:
    """Receive one message (or a batch) and process it in one transaction mode.

    :param handling: the endpoint's handlers and identity.
    :param receiver: how the messages are taken (the limits chosen at start-up).
    :param queue: the queue received from: the endpoint's input queue, or its
        instance-specific one.
    """

    mode: ClassVar[TransactionMode]

    def __init__(
        self,
        handling: Handling,
        receiver: Receiver,
        queue: str | addressing.QueueAddress | None = None,
    ) -> None:
        self.handling = handling
        self.settings = handling.settings
        self.transport = handling.transport
        self.receiver = receiver
        #: The queue received from: the endpoint's input queue, or its instance-specific one.
        self.queue: str | addressing.QueueAddress = handling.name if queue is None else queue
        #: ``NServiceBus.FailedQ`` of its failures: the queue's address as .NET writes it.
        self._failed_queue = self.transport.address_text(self.queue)
        self.failures = FailureCounts()

    def prepare(self) -> None:
        """Create what the mode needs at start-up (the rate limit's schedule, if any)."""
        self.receiver.prepare()

    def process(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive at most one message (or batch) and process it (the pump calls this)."""
        worker.allowance = None
        worker.fresh = True  # the transaction about to begin holds nothing yet
        receiver = self.receiver
        if not receiver.enter(worker):
            receipt.received(False)
            return
        try:
            self._process(receipt, worker)
        finally:
            receiver.leave(worker)

    def _process(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive in a transaction, handle inside a SAVEPOINT, commit or retry or move.

        The receive's transaction spans the handling (every mode but NONE); a batch takes
        :meth:`_process_batch` (:mod:`~sqlqueue_orm.receiving.modes.batching`).
        """
        if self.settings.batch_size > 1:
            self._process_batch(receipt, worker)
            return
        receiver = self.receiver
        with receipt.connect(self.transport.engine) as connection:
            transaction = receipt.begin(connection)
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
            if self._poison(receipt, connection, transaction, message):
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

    def _process_batch(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive and handle a batch in one transaction (the batching modes)."""
        raise NotImplementedError

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


    # -- shared steps ----------------------------------------------------------------------
    def _nothing_handled(
        self, transaction: Transaction, messages: list[IncomingMessage]
    ) -> None:
        """End a receive's transaction that handles nothing.

        *messages* taken (no rate token came in time) are rolled back to their places. With
        none taken the transaction changed nothing, and it commits: psycopg drops every
        prepared statement of its connection on a rollback (DEALLOCATE ALL, a round trip, then
        unprepared runs of each statement), which an empty receive need not cost.
        """
        if not messages:
            transaction.commit()
            return
        transaction.rollback()
        for message in messages:
            self._returned(message)

    def _returned(self, message: IncomingMessage) -> None:
        """*message*'s receive rolled back: the queue's receive floor must not pass it."""
        floor = self.receiver.table_queue.floor
        if floor is not None:
            floor.returned(message.row_version)

    def _transactional_sender(self, worker: WorkerState, connection: Connection) -> MessageScope:
        """Send in *connection*'s transaction, inside the message's SAVEPOINT (opened first).

        The sender is the scope of the message being handled by *worker* (set while a batched
        handler runs); a new one outside it.
        """
        scope = worker.scope
        return MessageScope(self.transport, connection) if scope is None else scope

    def _wake_destinations(self, sent: Iterable[str | addressing.QueueAddress]) -> None:
        """Wake this process's endpoints of the queues *sent* to in the committed transaction."""
        hooks = self.transport.sent_hooks
        if hooks:
            for destination in set(sent):
                address = self.transport.queues.address(destination)
                for hook in hooks:
                    hook(address)

    def _context(
        self, message: IncomingMessage, sender: Sender, session: Callable[[], Session]
    ) -> HandlerContext:
        return self.handling.context(message, sender, session)

    def _run_with_own_session(self, message: IncomingMessage, sender: Sender) -> None:
        """Run the handlers with a session of its own, committed when they succeed."""
        user_engine = self.handling.user_transport.engine
        context = self._context(
            message, sender, lambda: Session(bind=user_engine, expire_on_commit=False)
        )
        try:
            self.handling.invoke(context)
            if context.session_used is not None:
                context.session_used.commit()
        except BaseException:
            if context.session_used is not None:
                context.session_used.rollback()
            raise
        finally:
            if context.session_used is not None:
                context.session_used.close()

    def _poison(
        self,
        receipt: Receipt,
        connection: Connection,
        transaction: Transaction,
        message: IncomingMessage,
    ) -> bool:
        """Whether *message* is a poison row; if so it is moved, committed with its receive."""
        if message.headers_error is None:
            return False
        self._dead_letter(connection, message)
        receipt.commit(transaction)
        receipt.outcome("poison")
        return True

    def _dead_letter(self, connection: Connection, message: IncomingMessage) -> None:
        """Move a poison row, as stored, to the error queue (in *connection*'s tx)."""
        log.error(
            "queue %s: message %s cannot be read (%s); probable message "
            "metadata corruption, moving it to %s",
            self.queue,
            message.id,
            message.headers_error,
            self.settings.error_queue,
        )
        error_queue = self.settings.error_queue
        row = forwarding.poison_row(message)
        entry = failure_entries.writer(self.transport, error_queue, row, None)
        forwarding.forward(self.transport, error_queue, row, connection, entry)

    def _to_error_queue(
        self, connection: Connection | None, message: IncomingMessage, error: BaseException
    ) -> None:
        """Send *message* with the failure's headers to the error queue."""
        error_queue = self.settings.error_queue
        log.error(
            "queue %s: message %s (%s) failed, moving it to %s: %s: %s",
            self.queue,
            message.message_id,
            message.headers.get("NServiceBus.EnclosedMessageTypes"),
            error_queue,
            type(error).__name__,
            error,
        )
        handling = self.handling
        failure = forwarding.failure_headers(
            self._failed_queue, handling.name, handling.machine, error
        )
        row = forwarding.failed_row(message, failure)
        entry = failure_entries.writer(
            self.transport, error_queue, row, {**message.headers, **failure}
        )
        forwarding.forward(self.transport, error_queue, row, connection, entry)
        # its failures are forgotten by the caller once this commits: if the commit fails, the
        # message comes back with its attempts still counted (no second round of retries)

    def _forward_delayed(
        self, worker: WorkerState, connection: Connection, message: IncomingMessage
    ) -> IncomingMessage | None:
        """A matured delayed message to handle here, or None when it left the queue.

        It leaves when forwarded on (its destination set in :attr:`WorkerState.forwarded`), or
        for the error queue when its destination does not exist, in *connection*'s
        transaction.
        """
        try:
            local, destination = retries.arrived(
                self.transport, self.handling.name, connection, message, self.queue
            )
        except exceptions.QueueNotFound as error:
            self._to_error_queue(connection, message, error)
            return None
        if destination is None:
            return local
        worker.forwarded = destination
        return None

    def _wake_forwarded(self, worker: WorkerState) -> None:
        """Wake this process's endpoint of the queue a delayed message was forwarded to."""
        destination, worker.forwarded = worker.forwarded, None
        if destination is not None:
            for hook in self.transport.sent_hooks:
                hook(destination)

    def _audit(
        self, connection: Connection | None, message: IncomingMessage, started: dt.datetime
    ) -> None:
        """Copy the processed *message* to the audit queue, if there is one."""
        audit_queue = self.settings.audit_queue
        if audit_queue is None:
            return
        row = forwarding.audit_row(
            message,
            started,
            dt.datetime.now(dt.UTC),
            self.handling.name,
            self.handling.machine,
        )
        forwarding.forward(self.transport, audit_queue, row, connection)

    def _discard_expired(self, message: IncomingMessage) -> None:
        log.debug(
            "queue %s: message %s expired before it was received; discarded",
            self.queue,
            message.message_id,
        )

    def _failed(
        self,
        connection: Connection,
        message: IncomingMessage,
        scope: MessageScope,
        error: Exception,
        in_batch: bool,
    ) -> str:
        """*message*'s handlers raised *error*: roll back *scope*, then recoverability.

        The failure is counted and recoverability's decision carried out in the receive's
        transaction. Return the outcome: ``retried`` (nothing done: the caller retries it at
        once), ``delayed`` (its delayed retry written) or ``failed`` (moved to the error queue).
        """
        scope.rollback()  # and its sends
        attempts = self.failures.record(str(message.id))
        decision = retries.decide(self.settings, message, attempts, is_permanent(error))
        if decision.action == retries.IMMEDIATE:
            log.warning(
                "queue %s: message %s failed%s (attempt %d), retrying: %s: %s",
                self.queue,
                message.message_id,
                " in a batch" if in_batch else "",
                attempts,
                type(error).__name__,
                error,
            )
            return "retried"
        if decision.action == retries.DELAYED:
            retries.retry_later(
                self.transport, self.handling.name, connection, message, decision, self.queue
            )
            return "delayed"
        self._to_error_queue(connection, message, error)
        return "failed"
