"""The transaction modes (NServiceBus's ``ProcessWith*`` classes), one module for each kind.

* :mod:`~sqlqueue_orm.receiving.modes.base`: what every mode does alike (the receive of one
  message in a transaction spanning its handling, expired and poison messages, failures and
  recoverability, the error and audit queues), the plain
  :class:`~sqlqueue_orm.receiving.modes.base.Receiver` and the pump's
  :class:`~sqlqueue_orm.receiving.modes.base.Receipt`;
* :mod:`~sqlqueue_orm.receiving.modes.none`: NONE;
* :mod:`~sqlqueue_orm.receiving.modes.batching`: a batch in one transaction;
* :mod:`~sqlqueue_orm.receiving.modes.native`: the modes that use the receive's native
  transaction (RECEIVE_ONLY, SENDS_ATOMIC_WITH_RECEIVE, TRANSACTION_SCOPE), and
  :mod:`~sqlqueue_orm.receiving.modes.outbox`: how each of those sends and keeps its session.

The guarantees are in ``docs/endpoint.md``. :func:`for_endpoint` picks the mode, after checking
the databases can honour it, with the receiver the endpoint chose from its settings
(:func:`sqlqueue_orm.receiving.flow.receiver_for`).

SQLite has one writer at a time: a second connection that writes while the receive's
transaction is open would wait for it forever. So modes that need one are refused there at
start-up, with the mode to use instead. NONE commits the receive before the handlers run; its
handlers' sends join their session's transaction while it is open (it holds the lock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm import dialects, exceptions
from sqlqueue_orm.receiving.modes.base import ReceiveMode, Receiver, same_database
from sqlqueue_orm.receiving.modes.native import (
    ReceiveOnly,
    SendsAtomicWithReceive,
    TransactionScope,
)
from sqlqueue_orm.receiving.modes.none import NoTransaction
from sqlqueue_orm.receiving.modes.outbox import OutboxMode
from sqlqueue_orm.receiving.settings import TransactionMode

if TYPE_CHECKING:
    from sqlqueue_orm import addressing
    from sqlqueue_orm.receiving.handling import Handling

__all__ = ["MODES", "ReceiveMode", "check", "for_endpoint"]

#: The class of each transaction mode.
MODES: dict[TransactionMode, type[ReceiveMode]] = {
    mode.mode: mode
    for mode in (NoTransaction, ReceiveOnly, SendsAtomicWithReceive, TransactionScope, OutboxMode)
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


def check(handling: Handling) -> None:
    """Check the databases can honour the endpoint's mode with its settings.

    :raises ConfigurationError: a ``batch_size`` above 1 in a mode that cannot batch (NONE,
        RECEIVE_ONLY, SENDS_ATOMIC_WITH_RECEIVE); TRANSACTION_SCOPE with user data in another
        database (use the outbox); a concurrency limit in NONE on a server; on SQLite, a mode
        that would need a second writer while the receive is open.
    """
    settings = handling.settings
    mode = settings.transaction_mode
    name = handling.name
    same = same_database(handling)
    if settings.batch_size > 1 and mode not in BATCHING_MODES:
        raise exceptions.ConfigurationError(
            f"endpoint {name!r}: batch_size {settings.batch_size} cannot "
            f"run in {mode.name}: {_NO_BATCH[mode]}; batch in TRANSACTION_SCOPE or OUTBOX, "
            "or set batch_size=1"
        )
    if mode is TransactionMode.TRANSACTION_SCOPE and not same:
        raise exceptions.ConfigurationError(
            f"endpoint {name!r}: TRANSACTION_SCOPE keeps the receive, your data and "
            f"your sends in one transaction of {handling.transport.engine.url!r}, but the user "
            f"database is {handling.user_transport.engine.url!r}; use the OUTBOX mode for data "
            "in another database"
        )
    single_writer = dialects.for_dialect(handling.transport.engine).single_writer
    limited = [
        setting
        for setting, value in (
            ("global_concurrency", settings.global_concurrency),
            ("key_header", settings.key_header),
        )
        if value is not None
    ]
    if limited and mode is TransactionMode.NONE and not single_writer:
        raise exceptions.ConfigurationError(
            f"endpoint {name!r}: {' and '.join(limited)} cannot run in NONE: their "
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
                f"endpoint {name!r}: {mode.name} cannot run on SQLite: {refused} "
                "while the receive holds SQLite's only write lock; use TRANSACTION_SCOPE "
                "(everything in one transaction) or NONE"
            )


def for_endpoint(
    handling: Handling, receiver: Receiver, queue: str | addressing.QueueAddress | None = None
) -> ReceiveMode:
    """The mode of the endpoint's settings on *queue*, taking messages through *receiver*.

    :param receiver: how the mode takes messages (the plain receive or a limit, chosen once at
        start-up by :func:`sqlqueue_orm.receiving.flow.receiver_for`).
    :param queue: the queue it receives from (default the endpoint's input queue).
    :raises ConfigurationError: see :func:`check`.
    """
    check(handling)
    return MODES[handling.settings.transaction_mode](handling, receiver, queue)
