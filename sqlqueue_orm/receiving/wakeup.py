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
transaction and payload. :class:`NotifyListener` holds one connection of its own in
``LISTEN`` and wakes the pump, which peeks at once instead of at the end of its peek delay.
Polling stays as the fallback: a lost notification (the listener reconnecting) costs at most
one peek delay.

The cost: ``pg_notify`` serialises the commits of notifying transactions on one lock; see
``docs/endpoint.md`` for the figure measured on concurrent sends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.models.queue_table import queue_table

log = logging.getLogger(__name__)


def _statements(engine: Engine) -> dialects.base.NotifyWakeup:
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


def install_trigger(engine: Engine, address: addressing.QueueAddress) -> None:
    """Create the NOTIFY trigger on the queue table (PostgreSQL; replaces an older one)."""
    statements = _statements(engine)
    quoted = _quoted_table(engine, address)
    with db.wrap_db_errors(str(address)), engine.begin() as connection:
        # serialise concurrent installers: CREATE OR REPLACE FUNCTION races on pg_proc
        connection.execute(sa.text(statements.install_lock), {"key": statements.function})
        connection.exec_driver_sql(statements.create_function)
        connection.exec_driver_sql(statements.drop_trigger.format(table=quoted))
        connection.exec_driver_sql(statements.create_trigger.format(table=quoted))
    log.info("queue %s: NOTIFY wake-up trigger installed", address)


def remove_trigger(engine: Engine, address: addressing.QueueAddress) -> None:
    """Drop the NOTIFY trigger of the queue table, if it has one."""
    statements = _statements(engine)
    quoted = _quoted_table(engine, address)
    with db.wrap_db_errors(str(address)), engine.begin() as connection:
        connection.exec_driver_sql(statements.drop_trigger.format(table=quoted))


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


def local_wakeups(transport: Any) -> LocalWakeups:
    """The :class:`LocalWakeups` of *transport*, hooked into its sends on first use."""
    with _local_lock:
        wakeups: LocalWakeups | None = getattr(transport, "_sqlqueue_local_wakeups", None)
        if wakeups is None:
            wakeups = LocalWakeups()
            transport._sqlqueue_local_wakeups = wakeups
            transport.sent_hooks.append(wakeups.sent)
        return wakeups


class NotifyListener:
    """A thread with one connection in ``LISTEN``, calling *wake* for the queue's table.

    It reconnects (after ``retry_delay`` seconds) when its connection is lost; meanwhile the
    pump polls.
    """

    def __init__(
        self,
        engine: Engine,
        address: addressing.QueueAddress,
        wake: Callable[[], None],
        retry_delay: float = 1.0,
    ) -> None:
        self.engine = engine
        self.address = address
        self.wake = wake
        self.retry_delay = retry_delay
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()

    def start(self) -> None:
        """Start listening on a daemon thread."""
        self._thread = threading.Thread(
            target=self._run, name=f"{self.address.table} listener", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (within a second)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(2.0)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception as error:
                self.listening.clear()
                if self._stopping.is_set():
                    return
                log.warning(
                    "queue %s: NOTIFY listener lost its connection, polling meanwhile: %s",
                    self.address,
                    error,
                )
                self._stopping.wait(self.retry_delay)

    def _listen(self) -> None:
        raw = self.engine.raw_connection()
        try:
            driver: Any = raw.driver_connection
            driver.autocommit = True
            driver.execute(_statements(self.engine).listen)
            self.listening.set()
            self.wake()  # anything sent while we were not listening
            while not self._stopping.is_set():
                for notify in driver.notifies(timeout=0.5):
                    if notify.payload == self.address.table:
                        self.wake()
        finally:
            try:
                raw.invalidate()  # never hand a LISTENing connection back to the pool
            except Exception as error:
                log.debug("queue %s: closing the listener connection: %s", self.address, error)
