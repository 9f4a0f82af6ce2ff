"""One receive strategy per transaction mode (NServiceBus's ``ProcessWith*`` classes).

Each strategy takes one message off the input queue and runs the endpoint's handlers on it,
with the receive, the handlers' ORM session and their sends tied together as its mode says (the
guarantees are in ``docs/endpoint.md``). What they share:

* an expired message is discarded (the receive commits) without running a handler;
* a poison row (headers that cannot be read) is moved to the error queue as it is stored, in
  the receive's transaction, as NServiceBus's ``DeadLetter`` does;
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

SQLite has one writer at a time: a second connection that writes while the receive's
transaction is open would wait for it forever. So modes that need one are refused there at
start-up (:func:`for_endpoint`), with the mode to use instead.

**Batches** (``batch_size`` above 1, modes TRANSACTION_SCOPE and OUTBOX only): one transaction
receives up to ``batch_size`` messages with one receive statement, handles each under a
SAVEPOINT of its own (opened when its handlers first reach the database: handlers that write
nothing need none) and commits once. A failing handler rolls back its SAVEPOINT only; its
immediate retries run at once in the same transaction (each under a new SAVEPOINT, so the
message keeps its row version, its place and its ``Expires``), then it takes the delayed
retry or the error queue in that transaction. No other message of the batch is affected. A
crash re-delivers at most the uncommitted batch (``docs/scale.md``).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, ClassVar, Protocol

from sqlalchemy.engine import Connection, Engine, NestedTransaction, RootTransaction
from sqlalchemy.orm import Session

from sqlqueue_orm import addressing, dialects, exceptions
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION
from sqlqueue_orm.receiving import flow, forwarding, recoverability
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlqueue_orm.receiving.endpoint import Endpoint, HandlerContext, Sender
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Messages whose failures are remembered at most (the oldest are forgotten first).
_MAX_REMEMBERED_FAILURES = 10_000


class Slot(Protocol):
    """What the pump gives a strategy for one receive (see :class:`pump.MessagePump`)."""

    def received(self, found: bool) -> None:
        """Tell the pump the receive has run and whether it found a message."""

    def connect(self, engine: Engine, keep: bool = True) -> AbstractContextManager[Connection]:
        """The connection of this receive, for a ``with`` block.

        The pump's is the worker's connection, kept while receives keep coming (unless *keep*
        is False: given back when the block ends), which a timed-out stop can close; the block
        rolls back what it left open.
        """

    def commit(self, transaction: RootTransaction) -> None:
        """Commit the receive unless the stop abandoned this message (then roll back)."""

    def outcome(self, name: str, count: int = 1) -> None:
        """Count what became of *count* messages: handled, failed, retried, expired, poison."""


def _is_permanent(error: BaseException) -> bool:
    """Failures a retry cannot fix: no handler, or a body the model cannot read."""
    if isinstance(error, exceptions.UnknownMessageType):
        return True
    return any(
        cls.__name__ == "ValidationError" and cls.__module__.startswith("pydantic")
        for cls in type(error).__mro__
    )


class FailureCounts:
    """Failures per message, in memory (NServiceBus's ``FailureInfoStorage``), bounded."""

    def __init__(self, limit: int = _MAX_REMEMBERED_FAILURES) -> None:
        self._counts: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def record(self, key: str) -> int:
        """Count one more failure of *key*; return how many it has had."""
        with self._lock:
            count = self._counts.pop(key, 0) + 1
            self._counts[key] = count
            while len(self._counts) > self._limit:
                self._counts.popitem(last=False)
            return count

    def forget(self, key: str) -> None:
        """Drop what is known of *key* (it succeeded or left the queue)."""
        with self._lock:
            self._counts.pop(key, None)

    @property
    def size(self) -> int:
        """How many messages' failures are remembered."""
        return len(self._counts)

    def remembered(self, messages: Iterable[IncomingMessage]) -> list[str]:
        """The keys of those of *messages* whose failures are remembered; cheap when none are."""
        if not self._counts:  # nothing remembered: no lock, no ids to format
            return []
        with self._lock:
            return [key for message in messages if (key := str(message.id)) in self._counts]

    def forget_many(self, keys: list[str]) -> None:
        """Drop what is known of each of *keys* (a batch committed)."""
        if not keys:
            return
        with self._lock:
            for key in keys:
                self._counts.pop(key, None)


class _MessageScope:
    """One message's handling inside the receive's transaction: its SAVEPOINT and its sends.

    The SAVEPOINT opens when the handlers first reach the database: the session, a send, a
    defer (:attr:`connection`) or the audit copy open it first. A handler that touches none of
    them needs none: if it fails, nothing of it is in the transaction to roll back. So a
    message (or a batch) whose handlers write nothing is BEGIN, one receive, COMMIT.

    It is also the handlers' sender: each send goes out on the receive's connection and its
    destination is appended to :attr:`sent` (a batch's scopes share one list), to wake them
    after the commit; a rollback drops what this scope appended.
    """

    __slots__ = ("_connection", "_mark", "_transaction", "_transport", "sent")

    def __init__(
        self,
        transport: Transport,
        connection: Connection,
        sent: list[str | addressing.QueueAddress] | None = None,
    ) -> None:
        self._transport = transport
        self._connection = connection
        self._transaction: NestedTransaction | None = None
        #: The destinations sent to, in order (shared with the batch's other messages).
        self.sent: list[str | addressing.QueueAddress] = [] if sent is None else sent
        self._mark = len(self.sent)

    @property
    def opened(self) -> bool:
        """Whether the handlers reached the database (a send, the session, a defer).

        A scope not opened holds nothing: the next message of a batch may use it.
        """
        return self._transaction is not None

    def open(self) -> None:
        """Open the SAVEPOINT unless it is open already."""
        if self._transaction is None:
            self._transaction = self._connection.begin_nested()

    def rollback(self) -> None:
        """Roll back what the handler wrote (nothing to do if it wrote nothing)."""
        del self.sent[self._mark :]
        transaction = self._transaction
        if transaction is not None and transaction.is_active:
            # close() rolls back to the SAVEPOINT as rollback() does, without SQLAlchemy's
            # warning when a failed inner one (the handler's session's, the connection lost
            # mid-statement) is still the connection's current nested transaction
            transaction.close()

    def session(self) -> Session:
        """An ORM session in the receive's transaction, inside this SAVEPOINT (opened first)."""
        self.open()
        return Session(
            bind=self._connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )

    def release(self) -> None:
        """Keep what the handler wrote in the receive's transaction."""
        transaction = self._transaction
        if transaction is not None and transaction.is_active:
            transaction.commit()

    @property
    def connection(self) -> Connection:
        """The receive's connection, the SAVEPOINT open (:meth:`HandlerContext.defer`)."""
        self.open()
        return self._connection

    def __call__(
        self, destination: str | addressing.QueueAddress, outgoing: OutgoingMessage
    ) -> str:
        """Send *outgoing* to *destination* in the receive's transaction."""
        message_id = self._transport.send(destination, outgoing, connection=self.connection)
        self.sent.append(destination)
        return message_id


class ReceiveStrategy:
    """Receive one message and process it in one transaction mode."""

    mode: ClassVar[TransactionMode]

    def __init__(
        self, endpoint: Endpoint, queue: str | addressing.QueueAddress | None = None
    ) -> None:
        self.endpoint = endpoint
        self.transport = endpoint.transport
        #: The queue received from: the endpoint's input queue, or its instance-specific one.
        self.queue: str | addressing.QueueAddress = endpoint.name if queue is None else queue
        self.failures = FailureCounts()
        self._local = threading.local()
        # endpoint imports this module
        from sqlqueue_orm.receiving.endpoint import HandlerContext, ScopedContext

        self._context_class = HandlerContext
        self._scoped_context_class = ScopedContext
        limit = endpoint.settings.global_concurrency
        #: The global concurrency limit (:mod:`flow`), or None.
        self.gate = (
            None
            if limit is None
            else flow.GlobalConcurrency(
                self.transport.engine, self.transport.address_text(self.queue), limit
            )
        )
        settings = endpoint.settings
        #: The rate limit (:mod:`flow`), or None.
        self.rate = (
            None
            if settings.rate_limit is None
            else flow.RateLimit(
                self.transport.engine,
                self.transport.address_text(self.queue),
                settings.rate_limit,
                settings.rate_interval,
                settings.rate_burst or max(1, -(-settings.rate_limit // 10)),
            )
        )
        #: The per-key concurrency limit (:mod:`flow`), or None.
        self.keys = (
            None
            if settings.key_header is None
            else flow.KeyConcurrency(
                self.transport.engine,
                self.transport.address_text(self.queue),
                settings.key_header,
                settings.key_concurrency,
                settings.key_fifo,
                settings.key_window,
                batched=settings.batch_size > 1,
            )
        )

    def _transactional_sender(self, connection: Connection) -> _MessageScope:
        """Send in *connection*'s transaction, inside the message's SAVEPOINT (opened first).

        The sender is the scope of the message being handled on this thread
        (:meth:`_NativeTransaction._handle_batched` sets it); a new one outside it.
        """
        scope: _MessageScope | None = getattr(self._local, "scope", None)
        return _MessageScope(self.transport, connection) if scope is None else scope

    def _wake_destinations(self, sent: Iterable[str | addressing.QueueAddress]) -> None:
        """Wake this process's endpoints of the queues *sent* to in the committed transaction."""
        hooks = self.transport.sent_hooks
        if hooks:
            for destination in set(sent):
                address = self.transport._address(destination)
                for hook in hooks:
                    hook(address)

    def prepare(self) -> None:
        """Create what the mode needs at start-up (the rate limit's bucket, if any)."""
        if self.rate is not None:
            self.rate.prepare()

    def process(self, slot: Slot) -> None:
        """Receive at most one message (or batch) and process it (the pump calls this)."""
        self._local.allowance = None
        self._local.fresh = True  # the transaction about to begin holds nothing yet
        self._local.gated = False  # set by _claim when the receive takes the global slot
        if self.rate is not None and self.endpoint.settings.batch_size > 1:
            # a batch takes its tokens first, then receives as many messages (one message
            # takes its token after the receive: its handler starts right after the token)
            granted = self.rate.take(self.endpoint.settings.batch_size)
            if not granted:
                slot.received(False)
                return
            self._local.allowance = granted  # messages this receive may take
        gate = self.gate
        if gate is not None and not gate.enter():  # SQLite: a slot of this process
            slot.received(False)
            return
        try:
            self._process(slot)
        finally:
            if gate is not None:
                gate.leave()
            if self.keys is not None:
                self.keys.release()

    def _paced(self) -> bool:
        """One message received: take its token (True without a rate limit)."""
        if self.rate is None or self.endpoint.settings.batch_size > 1:
            return True
        return self.rate.take(1) > 0

    def _receive(self, connection: Connection, count: int) -> list[IncomingMessage]:
        """The receive, through the per-key or the global limit when there is one.

        The per-key limit also takes the global slot (:meth:`_claim` leaves it to it), in one
        statement with the key slots; so does the global limit's own receive when there is no
        per-key limit. The first receive of a transaction may roll it back.
        """
        keys, gate = self.keys, self.gate
        if keys is None and gate is None:
            return self.transport.receive(self.queue, count, connection=connection)
        first = self._local.__dict__.pop("fresh", True)
        self._local.fresh = False  # a later receive of this batch holds rows already
        if keys is not None:
            return keys.receive(self.transport, self.queue, connection, count, gate, first)
        assert gate is not None
        if first and self._local.gated:  # _claim left the slot to it
            return gate.receive(self.transport, self.queue, connection, count)
        return self.transport.receive(self.queue, count, connection=connection)

    def _process(self, slot: Slot) -> None:
        raise NotImplementedError

    def _nothing_handled(
        self, transaction: RootTransaction, messages: list[IncomingMessage]
    ) -> None:
        """End a receive's transaction that handles nothing.

        *messages* taken (no rate token came in time) are rolled back to their places. With
        none taken the transaction changed nothing, and it commits: psycopg drops every
        prepared statement of its connection on a rollback (DEALLOCATE ALL, a round trip, then
        five unprepared runs of each statement), which an empty receive need not cost.
        """
        if not messages:
            transaction.commit()
            return
        transaction.rollback()
        for message in messages:
            self._returned(message)

    def _returned(self, message: IncomingMessage) -> None:
        """*message*'s receive rolled back: the queue's receive floor must not pass it."""
        floor = self.transport._table_queue(self.queue).floor
        if floor is not None:
            floor.returned(message.row_version)

    def _claim(self, connection: Connection) -> bool:
        """Take a global slot in *connection*'s transaction (True without a limit).

        True at once when the receive takes the slot itself (:meth:`_receive`): the per-key
        receive's, or the global limit's own one-statement receive.
        """
        gate = self.gate
        if gate is None or (self.keys is not None and self.keys.takes_global_slot):
            return True
        if self.keys is None and gate.receives:
            self._local.gated = True
            return True
        return gate.claim(connection)

    def _context(
        self, message: IncomingMessage, sender: Sender, session: Callable[[], Session]
    ) -> HandlerContext:
        return self._context_class(self.endpoint, message, sender, session)

    def _dead_letter(self, connection: Connection, message: IncomingMessage) -> None:
        """Move a poison row, headers as stored, to the error queue (in *connection*'s tx)."""
        log.error(
            "queue %s: message %s has headers that cannot be read (%s); probable message "
            "metadata corruption, moving it to %s",
            self.queue,
            message.id,
            message.headers_error,
            self.endpoint.settings.error_queue,
        )
        forwarding.forward(
            self.transport,
            self.endpoint.settings.error_queue,
            forwarding.poison_row(message),
            connection,
        )

    def _to_error_queue(
        self, connection: Connection | None, message: IncomingMessage, error: BaseException
    ) -> None:
        """Send *message* with the failure's headers to the error queue."""
        error_queue = self.endpoint.settings.error_queue
        log.error(
            "queue %s: message %s (%s) failed, moving it to %s: %s: %s",
            self.queue,
            message.message_id,
            message.headers.get("NServiceBus.EnclosedMessageTypes"),
            error_queue,
            type(error).__name__,
            error,
        )
        row = forwarding.failed_row(message, self.endpoint.failure_headers(message, error))
        forwarding.forward(self.transport, error_queue, row, connection)
        # its failures are forgotten by the caller once this commits: if the commit fails, the
        # message comes back with its attempts still counted (no second round of retries)

    def _forward_delayed(
        self, connection: Connection, message: IncomingMessage
    ) -> IncomingMessage | None:
        """A matured delayed message to handle here, or None when it left the queue.

        It leaves when forwarded on, or for the error queue when its destination does not
        exist, in *connection*'s transaction.
        """
        try:
            local, destination = recoverability.arrived(
                self.endpoint, connection, message, self.queue
            )
        except exceptions.QueueNotFound as error:
            self._to_error_queue(connection, message, error)
            return None
        if destination is None:
            return local
        self._local.forwarded = destination
        return None

    def _wake_forwarded(self) -> None:
        """Wake this process's endpoint of the queue a delayed message was forwarded to."""
        destination = getattr(self._local, "forwarded", None)
        self._local.forwarded = None
        if destination is not None:
            for hook in self.transport.sent_hooks:
                hook(destination)
    def _audit(
        self, connection: Connection | None, message: IncomingMessage, started: dt.datetime
    ) -> None:
        """Copy the processed *message* to the audit queue, if there is one."""
        audit_queue = self.endpoint.settings.audit_queue
        if audit_queue is None:
            return
        row = forwarding.audit_row(
            message,
            started,
            dt.datetime.now(dt.UTC),
            self.endpoint.name,
            self.endpoint.machine,
        )
        forwarding.forward(self.transport, audit_queue, row, connection)

    def _discard_expired(self, message: IncomingMessage) -> None:
        log.debug(
            "queue %s: message %s expired before it was received; discarded",
            self.queue,
            message.message_id,
        )


class NoTransaction(ReceiveStrategy):
    """NONE: the receive commits first; a crash during handling loses the message.

    A handler failure sends the message to the error queue (no retries: it is no longer in the
    input queue). The handlers' session commits after them; their sends leave at once.
    """

    mode = TransactionMode.NONE

    def _process(self, slot: Slot) -> None:
        """Receive (committed), then handle outside any transaction of the queue."""
        # not kept: the handler runs after the block, and must not find it checked out still
        with slot.connect(self.transport.engine, keep=False) as connection:
            transaction = connection.begin()
            messages = self._receive(connection, 1)
            slot.received(bool(messages))
            if not messages or not self._paced():
                self._nothing_handled(transaction, messages)
                return
            message = messages[0]
            if message.headers_error is not None:
                self._dead_letter(connection, message)
                slot.commit(transaction)
                slot.outcome("poison")
                return
            local = self._forward_delayed(connection, message)
            slot.commit(transaction)  # the message is gone from here on
            if local is None:
                self._wake_forwarded()
                slot.outcome("handled")
                return
            message = local
        if message.expired:
            self._discard_expired(message)
            slot.outcome("expired")
            return
        started = dt.datetime.now(dt.UTC)
        user_engine = self.endpoint.user_transport.engine
        context = self._context(
            message,
            lambda destination, outgoing: self.transport.send(destination, outgoing),
            lambda: Session(bind=user_engine, expire_on_commit=False),
        )
        try:
            self.endpoint.invoke(context)
            if context.session_used is not None:
                context.session_used.commit()
        except Exception as error:
            if context.session_used is not None:
                context.session_used.rollback()
            slot.outcome("failed")
            self._to_error_queue(None, message, error)
            return
        finally:
            if context.session_used is not None:
                context.session_used.close()
        self._audit(None, message, started)
        slot.outcome("handled")


class _NativeTransaction(ReceiveStrategy):
    """The receive's transaction spans the handling; subclasses say how sends and sessions go."""

    def _process(self, slot: Slot) -> None:
        """Receive in a transaction, handle inside a SAVEPOINT, commit or retry or move."""
        if self.endpoint.settings.batch_size > 1:
            self._process_batch(slot)
            return
        with slot.connect(self.transport.engine) as connection:
            transaction = connection.begin()
            if not self._claim(connection):
                self._nothing_handled(transaction, [])
                slot.received(False)
                return
            messages = self._receive(connection, 1)
            slot.received(bool(messages))
            if not messages or not self._paced():
                self._nothing_handled(transaction, messages)
                return
            message = messages[0]
            if message.expired:
                self._discard_expired(message)
                slot.commit(transaction)
                slot.outcome("expired")
                return
            if message.headers_error is not None:
                self._dead_letter(connection, message)
                slot.commit(transaction)
                slot.outcome("poison")
                return
            local = self._forward_delayed(connection, message)
            if local is None:
                slot.commit(transaction)
                self._wake_forwarded()
                slot.outcome("handled")
                return
            message = local
            started = (
                dt.datetime.now(dt.UTC) if self.endpoint.settings.audit_queue is not None else None
            )
            # opened when the handlers first reach the database, as in a batch: handlers that
            # write nothing cost no SAVEPOINT round trips
            scope = _MessageScope(self.transport, connection)
            try:
                self._handle_batched(connection, message, scope)
                if started is not None:
                    scope.open()
                    self._audit(connection, message, started)  # in the receive's transaction
            except Exception as error:
                outcome = self._failed(connection, message, scope, error, in_batch=False)
                if outcome == "retried":
                    transaction.rollback()
                    self._returned(message)  # retried at once, so found at once
                else:  # delayed or failed: its retry or error-queue row commits with the receive
                    slot.commit(transaction)
                    self.failures.forget(str(message.id))  # once committed: gone from here
                slot.outcome(outcome)
                return
            scope.release()
            slot.commit(transaction)
            self._wake_destinations(scope.sent)
            self.failures.forget(str(message.id))
            slot.outcome("handled")

    def _process_batch(self, slot: Slot) -> None:
        """Receive up to ``batch_size`` messages in one transaction; commit them together.

        Each is handled under a SAVEPOINT of its own (see the module docstring). The loop over
        the messages is the batch's hot path: a message that is not expired, poison, a matured
        delayed message or audited runs its handlers right there (:meth:`_batch_one` takes the
        others, and the retries).
        """
        settings = self.endpoint.settings
        most = getattr(self._local, "allowance", None) or settings.batch_size
        outcomes: list[tuple[str, IncomingMessage]] = []
        sent: list[str | addressing.QueueAddress] = []
        forwarded: list[addressing.QueueAddress] = []
        audit = settings.audit_queue is not None
        handle = self._batch_handler()
        transport = self.transport
        with slot.connect(transport.engine) as connection:
            transaction = connection.begin()
            if not self._claim(connection):
                self._nothing_handled(transaction, [])
                slot.received(False)
                return
            opened = time.monotonic()
            taken = handled = 0
            received: list[IncomingMessage] = []
            while taken < most:
                messages = self._receive(connection, most - taken)
                if not taken:
                    slot.received(bool(messages))
                if not messages:
                    break
                taken += len(messages)
                received += messages
                scope = _MessageScope(transport, connection, sent)
                for message in messages:
                    if (
                        audit
                        or message.expired
                        or message.headers_error is not None
                        or FORWARD_DESTINATION in message.headers
                    ):
                        outcome = self._batch_one(
                            connection, message, outcomes, sent, forwarded, handle
                        )
                        outcomes.append((outcome, message))
                        continue
                    try:
                        handle(connection, message, scope)
                    except Exception as error:
                        failed = self._batch_failed(connection, message, scope, error, outcomes)
                        outcome = failed or self._batch_one(  # None: retry it at once
                            connection, message, outcomes, sent, forwarded, handle
                        )
                        outcomes.append((outcome, message))
                        scope = _MessageScope(transport, connection, sent)
                        continue
                    handled += 1
                    if scope.opened:  # else untouched: the next message's scope
                        scope.release()
                        scope = _MessageScope(transport, connection, sent)
                if time.monotonic() - opened >= settings.batch_flush:
                    break
            if not taken:
                self._nothing_handled(transaction, [])
                return
            # Every message of the batch is done with once it commits (handled, delayed, or
            # gone: the error queue, expired, poison): none of their failures is worth
            # remembering. The messages are let go of here, before the commit: a batch held
            # through the commit's WAL flush, by each worker at once, tipped the collector's
            # count of new objects (700) over and over: with 4 workers, 120 young collections
            # per drain of 40,000, and per drain of 200,000 2 or 3 full ones of everything the
            # process holds (75 to 115 ms, all threads stopped); 0 or 1 once they go before it.
            forget = self.failures.remembered(received)
            counts = collections.Counter(outcome for outcome, _ in outcomes)
            del received, messages, message, outcomes
            slot.commit(transaction)
        log.debug("queue %s: batch of %d committed", self.queue, taken)
        self._wake_destinations(sent)
        for destination in set(forwarded):
            for hook in self.transport.sent_hooks:
                hook(destination)
        self.failures.forget_many(forget)
        counts["handled"] += handled
        for outcome, count in counts.items():
            if count:
                slot.outcome(outcome, count)

    def _batch_handler(self) -> Callable[[Connection, IncomingMessage, _MessageScope], None]:
        """What runs a batched message's handlers in its scope (one lookup per batch)."""
        return self._handle_batched

    def _batch_one(
        self,
        connection: Connection,
        message: IncomingMessage,
        outcomes: list[tuple[str, IncomingMessage]],
        sent: list[str | addressing.QueueAddress],
        forwarded: list[addressing.QueueAddress],
        handle: Callable[[Connection, IncomingMessage, _MessageScope], None],
    ) -> str:
        """Process one message of a batch in *connection*'s transaction; return its outcome.

        Its immediate retries are appended to *outcomes* as they happen, the destinations of
        its sends to *sent*, a matured delayed message's destination to *forwarded*.
        """
        if message.expired:
            self._discard_expired(message)
            return "expired"
        if message.headers_error is not None:
            self._dead_letter(connection, message)
            return "poison"
        if FORWARD_DESTINATION in message.headers:  # a matured delayed message
            self._local.forwarded = None
            local = self._forward_delayed(connection, message)
            if local is None:
                if self._local.forwarded is not None:
                    forwarded.append(self._local.forwarded)
                self._local.forwarded = None
                return "handled"
            message = local
        audit = self.endpoint.settings.audit_queue is not None
        while True:
            started = dt.datetime.now(dt.UTC) if audit else None
            scope = _MessageScope(self.transport, connection, sent)
            try:
                handle(connection, message, scope)
                if started is not None:
                    scope.open()
                    self._audit(connection, message, started)
            except Exception as error:
                outcome = self._batch_failed(connection, message, scope, error, outcomes)
                if outcome is None:
                    continue  # an immediate retry
                return outcome
            scope.release()
            return "handled"

    def _batch_failed(
        self,
        connection: Connection,
        message: IncomingMessage,
        scope: _MessageScope,
        error: Exception,
        outcomes: list[tuple[str, IncomingMessage]],
    ) -> str | None:
        """A batched message's handlers raised *error* (:meth:`_failed`).

        Return its outcome (delayed, failed), or None for an immediate retry (appended to
        *outcomes*, counted once the batch commits).
        """
        outcome = self._failed(connection, message, scope, error, in_batch=True)
        if outcome == "retried":
            outcomes.append((outcome, message))
            return None
        return outcome

    def _failed(
        self,
        connection: Connection,
        message: IncomingMessage,
        scope: _MessageScope,
        error: Exception,
        in_batch: bool,
    ) -> str:
        """*message*'s handlers raised *error*: roll back *scope*, then recoverability.

        The failure is counted and recoverability's decision carried out in the receive's
        transaction. Return the outcome: ``retried`` (nothing done: the caller retries it at once),
        ``delayed`` (its delayed retry written) or ``failed`` (moved to the error queue).
        """
        scope.rollback()  # and its sends
        attempts = self.failures.record(str(message.id))
        decision = recoverability.decide(self.endpoint, message, attempts, _is_permanent(error))
        if decision.action == recoverability.IMMEDIATE:
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
        if decision.action == recoverability.DELAYED:
            recoverability.retry_later(self.endpoint, connection, message, decision, self.queue)
            return "delayed"
        self._to_error_queue(connection, message, error)
        return "failed"

    def _handle(self, connection: Connection, message: IncomingMessage) -> None:
        raise NotImplementedError

    def _handle_batched(
        self, connection: Connection, message: IncomingMessage, scope: _MessageScope
    ) -> None:
        """Run the handlers of a message in *scope* (its SAVEPOINT opened on their first write)."""
        self._local.scope = scope
        try:
            self._handle(connection, message)
        finally:
            self._local.scope = None

    def _run_with_own_session(self, message: IncomingMessage, sender: Sender) -> None:
        """Run the handlers with a session of its own, committed when they succeed."""
        user_engine = self.endpoint.user_transport.engine
        context = self._context(
            message, sender, lambda: Session(bind=user_engine, expire_on_commit=False)
        )
        try:
            self.endpoint.invoke(context)
            if context.session_used is not None:
                context.session_used.commit()
        except BaseException:
            if context.session_used is not None:
                context.session_used.rollback()
            raise
        finally:
            if context.session_used is not None:
                context.session_used.close()


class ReceiveOnly(_NativeTransaction):
    """RECEIVE_ONLY: the message returns on failure; sends leave at once (ghosts on failure)."""

    mode = TransactionMode.RECEIVE_ONLY

    def _handle(self, connection: Connection, message: IncomingMessage) -> None:
        self._run_with_own_session(
            message, lambda destination, outgoing: self.transport.send(destination, outgoing)
        )


class SendsAtomicWithReceive(_NativeTransaction):
    """SENDS_ATOMIC_WITH_RECEIVE: sends in the receive's transaction; the session apart."""

    mode = TransactionMode.SENDS_ATOMIC_WITH_RECEIVE

    def _handle(self, connection: Connection, message: IncomingMessage) -> None:
        self._run_with_own_session(message, self._transactional_sender(connection))


class TransactionScope(_NativeTransaction):
    """TRANSACTION_SCOPE: the receive, the session and the sends are one transaction."""

    mode = TransactionMode.TRANSACTION_SCOPE

    def _handle(self, connection: Connection, message: IncomingMessage) -> None:
        self._handle_batched(connection, message, self._transactional_sender(connection))

    def _handle_batched(
        self, connection: Connection, message: IncomingMessage, scope: _MessageScope
    ) -> None:
        self._batch_handler()(connection, message, scope)

    def _batch_handler(self) -> Callable[[Connection, IncomingMessage, _MessageScope], None]:
        """Invoke the handlers; commit the session's SAVEPOINT if they used it (tx stays open).

        The hot path of a batch: the scope is the sender and makes the session; no
        thread-local, and the handler dispatch looked up once per batch.
        """
        endpoint = self.endpoint
        invoke = endpoint.invoker()
        context_class = self._scoped_context_class

        def handle(connection: Connection, message: IncomingMessage, scope: _MessageScope) -> None:
            context = context_class(endpoint, message, scope)
            try:
                invoke(context)
            except BaseException:
                used = context.session_used
                if used is not None:
                    used.close()
                raise
            used = context.session_used
            if used is not None:
                try:
                    used.commit()  # flushes, releases its SAVEPOINT; tx stays open
                finally:
                    used.close()

        return handle


class OutboxStrategy(_NativeTransaction):
    """OUTBOX: RECEIVE_ONLY receive, handlers in a de-duplicated unit of work with the outbox."""

    mode = TransactionMode.OUTBOX

    def __init__(
        self, endpoint: Endpoint, queue: str | addressing.QueueAddress | None = None
    ) -> None:
        super().__init__(endpoint, queue)
        from sqlqueue_orm.sending.outbox import Outbox

        self.outbox = endpoint.outbox or Outbox(endpoint.user_transport)

    def prepare(self) -> None:
        """Create the outbox table if it is missing."""
        super().prepare()
        if self.endpoint.settings.create_queues:
            self.outbox.create_table()

    def _handle(self, connection: Connection, message: IncomingMessage) -> None:
        from sqlqueue_orm.session import UnitOfWork

        unit = UnitOfWork(
            self.endpoint.user_transport,
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
                self.endpoint.invoke(context)
        except exceptions.DuplicateMessage:
            log.info(
                "queue %s: message %s was handled concurrently elsewhere; not again",
                self.queue,
                message.message_id,
            )


STRATEGIES: dict[TransactionMode, type[ReceiveStrategy]] = {
    strategy.mode: strategy
    for strategy in (
        NoTransaction,
        ReceiveOnly,
        SendsAtomicWithReceive,
        TransactionScope,
        OutboxStrategy,
    )
}


#: The modes that keep their guarantee when messages are committed in batches.
BATCHING_MODES = (TransactionMode.TRANSACTION_SCOPE, TransactionMode.OUTBOX)
_NO_BATCH = {
    TransactionMode.NONE: "it commits each receive before the handler runs, so a crash would "
    "lose a whole batch",
    TransactionMode.RECEIVE_ONLY: "its sends leave at once, so a crash before the batch "
    "commits would repeat every send of the batch (ghost messages)",
    TransactionMode.SENDS_ATOMIC_WITH_RECEIVE: "its ORM session commits apart, message by "
    "message, so a crash before the batch commits would repeat every handler's data writes",
}


def _same_database(endpoint: Endpoint) -> bool:
    mine, theirs = endpoint.transport.engine, endpoint.user_transport.engine
    return mine is theirs or str(mine.url) == str(theirs.url)


def for_endpoint(
    endpoint: Endpoint, queue: str | addressing.QueueAddress | None = None
) -> ReceiveStrategy:
    """The strategy of *endpoint*'s mode, after checking the databases can honour it.

    :param queue: the queue it receives from (default the endpoint's input queue).

    :raises ConfigurationError: a ``batch_size`` above 1 in a mode that cannot batch (NONE,
        RECEIVE_ONLY, SENDS_ATOMIC_WITH_RECEIVE); TRANSACTION_SCOPE with user data in another
        database (use the outbox); on SQLite, a mode that would need a second writer while
        the receive is open.
    """
    mode = endpoint.mode
    same = _same_database(endpoint)
    if endpoint.settings.batch_size > 1 and mode not in BATCHING_MODES:
        raise exceptions.ConfigurationError(
            f"endpoint {endpoint.name!r}: batch_size {endpoint.settings.batch_size} cannot "
            f"run in {mode.name}: {_NO_BATCH[mode]}; batch in TRANSACTION_SCOPE or OUTBOX, "
            "or set batch_size=1"
        )
    if mode is TransactionMode.TRANSACTION_SCOPE and not same:
        raise exceptions.ConfigurationError(
            f"endpoint {endpoint.name!r}: TRANSACTION_SCOPE keeps the receive, your data and "
            f"your sends in one transaction of {endpoint.transport.engine.url!r}, but the user "
            f"database is {endpoint.user_transport.engine.url!r}; use the OUTBOX mode for data "
            "in another database"
        )
    single_writer = dialects.for_dialect(endpoint.transport.engine).single_writer
    limited = [
        name
        for name, value in (
            ("global_concurrency", endpoint.settings.global_concurrency),
            ("key_header", endpoint.settings.key_header),
        )
        if value is not None
    ]
    if limited and mode is TransactionMode.NONE and not single_writer:
        raise exceptions.ConfigurationError(
            f"endpoint {endpoint.name!r}: {' and '.join(limited)} cannot run in NONE: their "
            "slots are held by the receive's transaction, which NONE commits before the "
            "handlers run; use a transactional mode"
        )
    if single_writer:
        refused = None
        if mode in (TransactionMode.RECEIVE_ONLY, TransactionMode.OUTBOX):
            refused = "its sends or its unit of work write on a second connection"
        elif mode is TransactionMode.SENDS_ATOMIC_WITH_RECEIVE and same:
            refused = "its ORM session writes to the same SQLite file on a second connection"
        if refused:
            raise exceptions.ConfigurationError(
                f"endpoint {endpoint.name!r}: {mode.name} cannot run on SQLite: {refused} "
                "while the receive holds SQLite's only write lock; use TRANSACTION_SCOPE "
                "(everything in one transaction) or NONE"
            )
    return STRATEGIES[mode](endpoint, queue)
