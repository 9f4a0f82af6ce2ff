"""UnitOfWork: your data and the messages it causes commit together, or not at all.

A unit of work owns one connection and one transaction. ``uow.session`` is a SQLAlchemy ORM
:class:`~sqlalchemy.orm.Session` bound to that connection (it works in a SAVEPOINT of the
transaction, SQLAlchemy's "join an external transaction" recipe), and ``uow.send()`` joins the
same transaction. Leaving the block normally flushes the session and commits; an exception rolls
everything back and propagates::

    with UnitOfWork(transport) as uow:
        uow.session.add(Order(id=42, total=99))
        uow.send("billing", OutgoingMessage(b'{"order": 42}'))

Two ways to send, per unit of work (``mode=``) or per send (``uow.send(..., mode=...)``):

* ``"direct"`` (default): an INSERT into the destination queue's table, in this transaction.
  Nothing more is needed: the message exists exactly when the data does.
* ``"outbox"``: the message is stored in ``OutboxData`` in this transaction; right after the
  commit it is dispatched (best effort) and the record is marked dispatched. What the inline
  dispatch leaves (a crash, a queue that is down) the dispatcher process delivers
  (``sqlqueue outbox dispatch``). Destinations the outbox's :class:`Routing` places in another
  database always go through the outbox.

De-duplication of incoming messages: open the unit with ``incoming_message_id=`` and check
:attr:`UnitOfWork.already_handled` first. A message whose record was dispatched is skipped; one
stored but not dispatched has its stored messages dispatched again and is skipped; otherwise the
block runs, and its record is stored (with the incoming id as primary key) in the same
transaction, so of two concurrent units for one message only one can commit: the other raises
:class:`~sqlqueue_orm.exceptions.DuplicateMessage` and rolls back.
"""

from __future__ import annotations

import collections
import enum
import functools
import logging
import uuid
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Concatenate, Literal, ParamSpec, TypeVar

from sqlalchemy.engine import Connection, Engine, RootTransaction
from sqlalchemy.orm import Session

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import OutboxOperation
from sqlqueue_orm.sending.outbox_statements import outbox_errors
from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

SendMode = Literal["direct", "outbox"]
_MODES = ("direct", "outbox")

P = ParamSpec("P")
R = TypeVar("R")

# Engines passed directly get one Transport each (it caches per-queue statements and probes).
_transports: weakref.WeakKeyDictionary[Engine, Transport] = weakref.WeakKeyDictionary()


class Outcome(enum.Enum):
    """What a unit of work opened for an incoming message found."""

    #: Not handled before: run the block.
    RUN = "run"
    #: Handled and its messages dispatched before: skip the block.
    ALREADY_HANDLED = "already handled"
    #: Handled before but its messages not dispatched: they were dispatched now; skip the block.
    REDISPATCHED = "redispatched"


def _transport_of(target: Transport | Engine) -> Transport:
    if isinstance(target, Transport):
        return target
    if isinstance(target, Engine):
        transport = _transports.get(target)
        if transport is None:
            transport = _transports[target] = Transport(target)
        return transport
    raise exceptions.ConfigurationError(
        f"a unit of work needs a Transport or an Engine, not {target!r}"
    )


def _check_mode(mode: str) -> SendMode:
    if mode not in _MODES:
        raise exceptions.ConfigurationError(f"send mode {mode!r} is not one of {_MODES}")
    return mode  # type: ignore[return-value]


class UnitOfWork:
    """One connection, one transaction: an ORM session and sends that commit together.

    :param transport: the transport (or engine) of the database holding your data.
    :param mode: ``"direct"`` or ``"outbox"``: how sends to queues in this database are made.
    :param outbox: the outbox to store and dispatch through (long-lived; it holds the routing to
        other databases). Default: an outbox of *transport* with every queue local.
    :param incoming_message_id: the id of the message this unit handles, for de-duplication.
    :param after_commit: called with the unit right after the commit, before the inline
        dispatch (hooks, metrics, and crash tests).
    :param dispatch_inline: dispatch outbox messages right after the commit (default); turn
        off to leave them all to the dispatcher process.
    """

    def __init__(
        self,
        transport: Transport | Engine,
        *,
        mode: SendMode = "direct",
        outbox: Outbox | None = None,
        incoming_message_id: str | None = None,
        after_commit: Callable[[UnitOfWork], object] | None = None,
        dispatch_inline: bool = True,
    ) -> None:
        self.transport = _transport_of(transport)
        self.mode = _check_mode(mode)
        if outbox is not None and outbox.transport.engine is not self.transport.engine:
            raise exceptions.ConfigurationError(
                f"the outbox is in {outbox.transport.engine.url!r}, not in the unit of work's "
                f"database {self.transport.engine.url!r}"
            )
        self.outbox = outbox if outbox is not None else Outbox(self.transport)
        if incoming_message_id is not None and (
            not isinstance(incoming_message_id, str) or not 0 < len(incoming_message_id) <= 200
        ):
            raise exceptions.ConfigurationError(
                f"incoming message id {incoming_message_id!r} must be a string of 1 to 200 "
                "characters"
            )
        self.incoming_message_id = incoming_message_id
        self.after_commit = after_commit
        self.dispatch_inline = dispatch_inline
        #: What de-duplication found (always RUN without an incoming message id).
        self.outcome = Outcome.RUN
        #: Messages sent per queue address, by either mode.
        self.sent: collections.Counter[str] = collections.Counter()
        #: The outbox record stored at commit (None if nothing needed one).
        self.record_id: str | None = None
        self.committed = False
        self._operations: list[OutboxOperation] = []
        self._connection: Connection | None = None
        self._transaction: RootTransaction | None = None
        self._session: Session | None = None
        self._used = False

    def __repr__(self) -> str:
        state = "committed" if self.committed else "open" if self._connection else "closed"
        return f"<UnitOfWork {self.mode} {state} {self.outcome.value}>"

    # -- the open unit ---------------------------------------------------------------------
    @property
    def already_handled(self) -> bool:
        """True when the incoming message was handled before: skip the work (nothing commits)."""
        return self.outcome is not Outcome.RUN

    @property
    def connection(self) -> Connection:
        """The connection of the unit, in its transaction (for Core statements)."""
        if self._connection is None:
            raise exceptions.SqlQueueError("the unit of work is not open: use it in a with block")
        return self._connection

    @property
    def session(self) -> Session:
        """The ORM session for your models, bound to the unit's connection and transaction."""
        if self._session is None:
            raise exceptions.SqlQueueError("the unit of work is not open: use it in a with block")
        return self._session

    def send(
        self,
        destination: str | addressing.QueueAddress,
        message: OutgoingMessage,
        *,
        mode: SendMode | None = None,
    ) -> str:
        """Send *message* to *destination* in this unit's transaction; return its message id.

        :param mode: override the unit's mode for this send.
        """
        return self.send_many(destination, [message], mode=mode)[0]

    def send_many(
        self,
        destination: str | addressing.QueueAddress,
        messages: Sequence[OutgoingMessage],
        *,
        mode: SendMode | None = None,
    ) -> list[str]:
        """Send *messages* to *destination* in this unit's transaction; return their message ids.

        :raises DuplicateMessage: the incoming message was already handled (check
            :attr:`already_handled` before doing the work).
        """
        connection = self.connection
        if self.already_handled:
            assert self.incoming_message_id is not None
            raise exceptions.DuplicateMessage(self.incoming_message_id)
        chosen = self.mode if mode is None else _check_mode(mode)
        router = self.outbox.router
        if not router.is_local(destination):
            chosen = "outbox"
            address = addressing.QueueAddress.coerce(destination)
        else:
            address = self.transport.queues.address(destination)
        name = str(address)
        if chosen == "direct":
            ids = self.transport.send_many(address, messages, connection=connection)
        elif self.transport.instrumentation is not None:  # a send span around the storing
            ids = self.transport.instrumentation.send(
                name, messages, lambda traced: self._store(name, traced)
            )
        else:
            ids = self._store(name, messages)
        self.sent[name] += len(ids)
        return ids

    def _store(self, name: str, messages: Sequence[OutgoingMessage]) -> list[str]:
        """Keep *messages* for *name* as outbox operations, stored at the commit."""
        prepared = [message.prepare() for message in messages]
        self._operations.extend(OutboxOperation.from_prepared(name, item) for item in prepared)
        return [item.message_id for item in prepared]

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> UnitOfWork:
        self.start()
        with db.wrap_db_errors():
            connection = self.transport.engine.connect()
            try:
                transaction = connection.begin()
            except BaseException:
                connection.close()
                raise
        self.join(
            connection,
            transaction,
            Session(
                bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
            ),
        )
        return self

    def start(self) -> None:
        """Mark the unit used and de-duplicate the incoming message (before any connection).

        Entering the unit does it; the asyncio unit of work calls it before its connection.
        """
        if self._used:
            raise exceptions.SqlQueueError("a unit of work can be used once; make a new one")
        self._used = True
        if self.incoming_message_id is not None:
            self.outcome = self._deduplicate(self.incoming_message_id)

    def join(self, connection: Connection, transaction: RootTransaction, session: Session) -> None:
        """Open the unit on *connection* in *transaction*, with *session* bound to them.

        The asyncio unit of work (:mod:`sqlqueue_orm.aio.session`) opens its own connection and
        session and joins them here; the commit and the rollback are this class's.
        """
        self._connection = connection
        self._transaction = transaction
        self._session = session

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None and self.outcome is Outcome.RUN:
                self._commit()
            else:
                self._rollback()
        finally:
            self._close()
        if self.committed:
            self._after_commit()

    def _deduplicate(self, message_id: str) -> Outcome:
        with outbox_errors(), self.transport.engine.connect() as connection:
            record = self.outbox.get(connection, message_id)
            connection.rollback()
        if record is None:
            return Outcome.RUN
        if record.dispatched:
            log.info("message %s: already handled; skipping it", message_id)
            return Outcome.ALREADY_HANDLED
        log.info(
            "message %s: handled before but its %d message(s) were not dispatched; "
            "dispatching them now",
            message_id,
            len(record.operations),
        )
        self.outbox.dispatch(message_id)
        return Outcome.REDISPATCHED

    def _commit(self) -> None:
        session, transaction = self.session, self._transaction
        assert transaction is not None
        try:
            session.flush()
            session.commit()  # releases the session's SAVEPOINT; the transaction stays open
            if self._operations or self.incoming_message_id is not None:
                record_id = self.incoming_message_id or str(uuid.uuid4())
                self.outbox.store(
                    self.connection,
                    record_id,
                    self._operations,
                    dispatched=not self._operations,
                )
                self.record_id = record_id
            with db.wrap_db_errors():
                transaction.commit()
        except BaseException:
            self._rollback()
            raise
        self.committed = True
        log.debug("unit of work committed: %s", dict(self.sent))

    def _rollback(self) -> None:
        try:
            if self._session is not None:
                self._session.close()
        finally:
            if self._transaction is not None and self._transaction.is_active:
                self._transaction.rollback()

    def _close(self) -> None:
        try:
            if self._session is not None:
                self._session.close()
        finally:
            self._session = None
            self._transaction = None
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _after_commit(self) -> None:
        if self.after_commit is not None:
            self.after_commit(self)
        if not (self.dispatch_inline and self._operations and self.record_id):
            return
        queues = ", ".join(sorted({operation.destination for operation in self._operations}))
        try:
            self.outbox.dispatch(self.record_id)
        except Exception as error:  # best effort: the dispatcher process delivers the rest
            log.warning(
                "outbox record %s: inline dispatch to %s failed; the dispatcher will deliver "
                "it: %s",
                self.record_id,
                queues,
                error,
            )


def unit_of_work(
    transport: Transport | Engine,
    *,
    mode: SendMode = "direct",
    outbox: Outbox | None = None,
    incoming_message_id: Callable[..., str | None] | None = None,
    after_commit: Callable[[UnitOfWork], object] | None = None,
) -> Callable[[Callable[Concatenate[UnitOfWork, P], R]], Callable[P, R | None]]:
    """Decorator: run the function in a new :class:`UnitOfWork`, passed as its first argument.

    ::

        @unit_of_work(transport, incoming_message_id=lambda message: message.message_id)
        def handle(uow: UnitOfWork, message: IncomingMessage) -> None:
            uow.session.add(Payment(order_id=message.model(Paid).order_id))
            uow.send("shipping", OutgoingMessage(message.body))

        handle(message)   # commits, or rolls back and raises; None if handled before

    :param incoming_message_id: called with the function's arguments; returns the id of the
        message being handled, for de-duplication. When that message was handled before, the
        function is not called and the call returns ``None``.
    """

    def decorate(function: Callable[Concatenate[UnitOfWork, P], R]) -> Callable[P, R | None]:
        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            message_id = incoming_message_id(*args, **kwargs) if incoming_message_id else None
            uow = UnitOfWork(
                transport,
                mode=mode,
                outbox=outbox,
                incoming_message_id=message_id,
                after_commit=after_commit,
            )
            with uow:
                if uow.already_handled:
                    return None
                return function(uow, *args, **kwargs)

        return wrapper

    return decorate
