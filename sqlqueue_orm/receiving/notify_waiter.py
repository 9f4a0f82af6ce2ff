"""PostgreSQL: an idle pump registers as waiting and LISTENs, so only then do sends notify.

One connection per pump, of its own (never handed back to the pool), both ``LISTEN``s and
holds the registration: a session-level exclusive advisory lock on the queue's waiting slot
(:class:`~sqlqueue_orm.dialects.statements.NotifyWakeup`). The queue table's trigger tests the slot
in its ``WHEN`` with shared transaction-level locks and notifies only when one is held, so
under load, with nobody waiting, a send runs no ``pg_notify``. A killed process's session
ends with its connection, and its registration with it.

Why nothing is missed: the pump registers, then peeks, then sleeps. A send either saw the
registration (it notifies at its commit, and this connection hears it), or checked before
it; then its shared lock, held until it commits, made the registration fail. A failed
registration (a sender in flight, or the slot held by another waiter) is retried after a
pause growing from :data:`FIRST_RETRY` to the peek delay, each retry peeking first: a long
transaction that sends costs the waiter polls at that pace, never a message. Every waiter
listens, registered or not, and a notification wakes them all: one registration per queue is
enough, and each slot would cost every send one more lock try.

Threads: the pump's loop thread registers and unregisters (synchronously, so the order above
holds); this module's thread waits on the socket with ``select()`` and reads the
notifications. psycopg keeps notifications that arrive during another statement in a backlog;
after each statement the loop thread pokes a pipe so the listening thread collects them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from sqlqueue_orm import addressing
    from sqlqueue_orm.dialects.statements import NotifyWakeup

log = logging.getLogger(__name__)

#: First pause (seconds) after a registration failed; it doubles up to the peek delay.
FIRST_RETRY = 0.005


def _nothing() -> None:
    """Before :meth:`NotifyWaiter.start`: nothing to wake."""


@dataclasses.dataclass(eq=False)
class NotifyWaiter:
    """LISTEN and the waiting registration of one pump (see the module docstring).

    :param engine: the engine its own connection comes from.
    :param address: the queue it waits on.
    :param key: the queue's table key (:func:`~sqlqueue_orm.receiving.wakeup.ensure_trigger`).
    :param statements: the dialect's LISTEN and registration statements.
    :param retry_delay: seconds before reconnecting a lost connection (the pump polls).
    """

    polls = False

    engine: Engine
    address: addressing.QueueAddress
    key: int
    statements: NotifyWakeup
    retry_delay: float = 1.0

    def __post_init__(self) -> None:
        #: Set while the connection LISTENs.
        self.listening = threading.Event()
        self._register = self.statements.register_statement(self.key)
        self._wake: Callable[[], None] = _nothing
        self._nudge: Callable[[], None] = _nothing
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: Guards the connection and the slot held (the loop thread and the listener's).
        self._lock = threading.Lock()
        self._driver: Any = None
        self._slot: int | None = None
        self._pause = 0.0
        #: Pokes the listening thread (opened by :meth:`start`, closed by :meth:`stop`).
        self._pipe = (-1, -1)
        self._pipe_open = False

    @property
    def registered(self) -> bool:
        """Whether this pump holds a waiting slot now."""
        return self._slot is not None

    def start(self, wake: Callable[[], None], nudge: Callable[[], None]) -> None:
        """Listen on a daemon thread: *wake* for each notification of the queue.

        *nudge* (peek, and register when idle) once the connection listens.
        """
        self._wake = wake
        self._nudge = nudge
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)
        self._pipe_open = True
        self._thread = threading.Thread(
            target=self._run, name=f"{self.address.table} listener", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; closing the connection ends the registration."""
        self._stopping.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(2.0)
            if self._thread.is_alive():
                return  # it ends within a second: its pipe stays open until then
        with self._lock:
            if self._pipe_open:
                self._pipe_open = False
                for end in self._pipe:
                    os.close(end)

    def idle(self, delay: float) -> float | None:
        """Register (then the pump peeks once more: None), or the seconds to sleep."""
        with self._lock:
            driver = self._driver
            if driver is None or self._slot is not None:
                return delay  # not listening (polling), or registered already
            try:
                slot = driver.execute(self._register).fetchone()[0]
            except Exception as error:  # the listening thread sees it too and reconnects
                log.debug("queue %s: registering as waiting failed: %s", self.address, error)
                return delay
            finally:
                self._poke()
            if slot is not None:
                self._slot = int(slot)
                self._pause = 0.0
                return None
        # a sender is in flight (its shared lock), or another waiter holds the slot
        self._pause = min(delay, max(FIRST_RETRY, self._pause * 2))
        return self._pause

    def busy(self) -> None:
        """Unregister: sends need not notify while the pump has work."""
        with self._lock:
            slot, self._slot = self._slot, None
            self._pause = 0.0
            driver = self._driver
            if slot is None or driver is None:
                return
            statement = self.statements.unregister.format(slot=slot, table_key=self.key)
            try:
                driver.execute(statement)
            except Exception as error:  # its session, and so its lock, is gone
                log.debug("queue %s: unregistering failed: %s", self.address, error)
            finally:
                self._poke()

    def _poke(self) -> None:
        """Make the listening thread look at the connection (and stop, when stopping)."""
        if self._pipe_open:
            try:
                os.write(self._pipe[1], b".")
            except OSError:  # full: the listening thread has a poke to read already
                pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception as error:
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
            driver.execute(self.statements.listen)
            with self._lock:
                self._driver = driver
                self._slot = None
            self.listening.set()
            # Peek, and register when idle: the pump may be asleep, unregistered, since before
            # this connection (a peek, not a send's wake-up: that would unregister it at once).
            self._nudge()
            table = self.address.table
            readable = [driver.fileno(), self._pipe[0]]
            while not self._stopping.is_set():
                ready, _, _ = select.select(readable, [], [], 1.0)
                if self._pipe[0] in ready:
                    os.read(self._pipe[0], 4096)
                for notify in driver.notifies(timeout=0):
                    if notify.payload == table:
                        self._wake()
        finally:
            self.listening.clear()
            with self._lock:
                self._driver = None
                self._slot = None
            try:
                raw.invalidate()  # never hand a LISTENing connection back to the pool
            except Exception as error:
                log.debug("queue %s: closing the listener connection: %s", self.address, error)
