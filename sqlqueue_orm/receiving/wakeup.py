"""Wake-up instead of polling: in-process on every database, ``LISTEN``/``NOTIFY`` on PostgreSQL.

In-process (:class:`LocalWakeups`): a send this process commits through the endpoint's
:class:`~sqlqueue_orm.transport.Transport` (``transport.send`` without a connection,
``endpoint.send``, or a handler's sends once the receive commits) wakes the endpoints of that
queue at once. A send in a transaction of your own wakes nobody (the commit is yours): polling
finds it.

On PostgreSQL (its statements are ``dialects.postgresql.NOTIFY_WAKEUP``, reached as
``dialects.for_dialect(engine).notify_wakeup``):

A statement-level ``AFTER INSERT`` trigger on the queue table calls ``pg_notify`` with the
table's name, so every writer's sends (.NET endpoints included) wake the endpoints listening;
PostgreSQL delivers the notification when the sending transaction commits, once per
transaction and payload. The trigger fires only while an idle endpoint is registered as
waiting (a session advisory lock on the queue's waiting slot, tested in the trigger's
``WHEN``): under load nobody waits and the sends pay no ``pg_notify``.
:class:`~sqlqueue_orm.receiving.notify_waiter.NotifyWaiter` LISTENs and registers;
:func:`ensure_trigger` installs the trigger at start when it is missing or out of date.
Polling stays as the fallback: a lost notification (the listener reconnecting) costs at most
one peek delay.

The cost: ``pg_notify`` serialises the commits of notifying transactions on one lock, paid
only while somebody waits; see ``docs/endpoint.md``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.models.queue_table import queue_table

log = logging.getLogger(__name__)


def _statements(engine: Engine) -> dialects.statements.NotifyWakeup:
    """The dialect's ``LISTEN``/``NOTIFY`` statements (:class:`ConfigurationError` if none)."""
    statements = dialects.for_dialect(engine).notify_wakeup
    if statements is None:
        raise exceptions.ConfigurationError(
            f"database dialect {engine.dialect.name!r} has no NOTIFY wake-up; "
            "its receivers poll"
        )
    return statements


def _quoted_table(engine: Engine, address: addressing.QueueAddress) -> str:
    table = queue_table(address.table, db.schema_argument(address), engine.dialect)
    return str(engine.dialect.identifier_preparer.format_table(table))


def queue_key(connection: Connection, address: addressing.QueueAddress) -> int:
    """The queue's table key (``NotifyWakeup.table_key``), of the names in the catalog."""
    statements = _statements(connection.engine)
    quoted = _quoted_table(connection.engine, address)
    schema, name = connection.execute(
        sa.text(statements.table_identity), {"table": quoted}
    ).one()
    return statements.table_key(str(schema), str(name))


def ensure_trigger(
    engine: Engine, address: addressing.QueueAddress, *, required: bool = False
) -> int | None:
    """Install the conditional NOTIFY trigger on the queue table unless it is there already.

    The catalog is read first: ``CREATE TRIGGER`` and ``DROP TRIGGER`` take strong table locks,
    so a start must not queue behind a long transaction when the right trigger is in place.
    Installers take turns on the install lock. An older trigger (the unconditional one) is
    replaced. Return the queue's key (:func:`queue_key`), or None when the role may not create
    the trigger (not the table's owner): one warning, and the endpoint polls.

    :param required: raise :class:`ConfigurationError` instead of warning when the trigger
        cannot be created.
    """
    statements = _statements(engine)
    quoted = _quoted_table(engine, address)
    catalog = sa.text(statements.trigger_catalog)
    parameters = {"table": quoted, "trigger": statements.trigger}
    with db.wrap_db_errors(str(address)), engine.connect() as connection:
        key = queue_key(connection, address)
        row = connection.execute(catalog, parameters).first()
        connection.rollback()
        if row is not None and statements.trigger_is_current(row[0], row[1] or "", key):
            return key
    try:
        with db.wrap_db_errors(str(address)), engine.begin() as connection:
            # serialise installers: CREATE OR REPLACE FUNCTION races on pg_proc
            connection.execute(sa.text(statements.install_lock), {"key": statements.function})
            row = connection.execute(catalog, parameters).first()
            if row is not None and statements.trigger_is_current(row[0], row[1] or "", key):
                return key  # another installer was first
            connection.exec_driver_sql(statements.create_function)
            connection.exec_driver_sql(statements.drop_trigger.format(table=quoted))
            connection.exec_driver_sql(statements.trigger_statement(quoted, key))
    except exceptions.SqlQueueError as error:
        if not any(marker in str(error) for marker in statements.cannot_create_markers):
            raise
        cause = str(error).splitlines()[0]
        if required:
            raise exceptions.ConfigurationError(
                f"queue {address}: notify=True needs the NOTIFY wake-up trigger, which this "
                f"role may not create ({cause}); `sqlqueue verify --wakeup QUEUE` shows the "
                "statements to run as the table's owner"
            ) from error
        log.warning(
            "queue %s: cannot create the NOTIFY wake-up trigger (%s); sends from other "
            "processes are found by polling, every peek_delay",
            address,
            cause,
        )
        return None
    log.info("queue %s: NOTIFY wake-up trigger installed", address)
    return key


def install_trigger(engine: Engine, address: addressing.QueueAddress) -> None:
    """Create (or replace) the NOTIFY trigger on the queue table (:func:`ensure_trigger`)."""
    ensure_trigger(engine, address, required=True)


def remove_trigger(engine: Engine, address: addressing.QueueAddress) -> None:
    """Drop the NOTIFY trigger of the queue table, if it has one."""
    statements = _statements(engine)
    quoted = _quoted_table(engine, address)
    with db.wrap_db_errors(str(address)), engine.begin() as connection:
        connection.exec_driver_sql(statements.drop_trigger.format(table=quoted))


class IdleWaiter(Protocol):
    """How an idle pump learns of other processes' sends (:mod:`~.waiting` makes one).

    The pump calls :meth:`idle` from its loop thread each time a peek found nothing, before it
    sleeps, and :meth:`busy` once it handed out receive tasks again.
    """

    #: Set while the waiter can hear other processes' sends.
    listening: threading.Event
    #: Whether the pump polls in bursts instead (``wakeup="poll"``, or a pooler detected).
    polls: bool

    def start(self, wake: Callable[[], None], nudge: Callable[[], None]) -> None:
        """Begin: *wake* for a send to the queue, *nudge* for "something changed: peek"."""

    def stop(self) -> None:
        """Stop listening and unregister (within a second or two)."""

    def idle(self, delay: float) -> float | None:
        """A peek found nothing: seconds to sleep, or None to peek once more first."""

    def busy(self) -> None:
        """The pump has work again: stop waiting (sends need not wake it)."""


class LocalWakeups:
    """The pumps of this process per queue table, woken by the sends of one transport."""

    def __init__(self) -> None:
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        self._lock = threading.Lock()

    def register(self, table: str, wake: Callable[[], None]) -> None:
        """Call *wake* whenever a send to *table* is committed."""
        with self._lock:
            self._wakers[table] = [*self._wakers.get(table, []), wake]

    def unregister(self, table: str, wake: Callable[[], None]) -> None:
        """Stop calling *wake*."""
        with self._lock:
            self._wakers[table] = [each for each in self._wakers.get(table, []) if each != wake]

    def sent(self, address: addressing.QueueAddress) -> None:
        """A send to *address* was committed: wake its pumps (the transport's hook)."""
        for wake in self._wakers.get(address.table, ()):
            wake()


_local_lock = threading.Lock()
#: Each transport's :class:`LocalWakeups`, for as long as the transport lives.
_local: weakref.WeakKeyDictionary[Any, LocalWakeups] = weakref.WeakKeyDictionary()


def local_wakeups(transport: Any) -> LocalWakeups:
    """The :class:`LocalWakeups` of *transport*, hooked into its sends on first use."""
    with _local_lock:
        wakeups = _local.get(transport)
        if wakeups is None:
            wakeups = LocalWakeups()
            _local[transport] = wakeups
            transport.sent_hooks.append(wakeups.sent)
        return wakeups
