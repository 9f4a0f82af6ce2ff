"""Live control inside a running endpoint: read its control row, pause, resume and resize.

:mod:`sqlqueue_orm.control` writes an endpoint's row of ``sqlqueue_endpoint_control``; each
running process of the endpoint has a :class:`ControlPoller`, a daemon thread that reads that row
by its primary key every :data:`POLL_INTERVAL` seconds and applies what changed to the
endpoint's pumps:

* **paused**: the pump's loop waits before its next peek, and a worker given a receive task
  cancels it, so no peek and no receive runs; handlers in flight finish and commit; the loop and
  the workers stay alive (and keep no connection: an idle worker gives its back to the pool).
* **resumed**: the loop is woken and peeks at once.
* **a concurrency override** (the input queue's pump only; the instance-specific queue keeps
  ``instance_concurrency``): growing starts worker threads at once, as many as are missing
  (workers a shrink is ending still count until they end); shrinking ends the workers too many,
  each after the message it is handling; clearing it returns to the configured concurrency.
  No receive begins while more than the new concurrency run.

An endpoint reads its row once before its pumps start, so one started while paused starts
paused. An endpoint that creates its queues creates the control table too; one that does not,
finding no table, says so once and looks for it every :data:`MISSING_TABLE_INTERVAL` seconds
(not a failing query twice a second). A database error while reading is logged (naming the
endpoint) and the last state is kept: it never stops the pump, and the next read tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import sqlalchemy as sa

from sqlqueue_orm import control, db
from sqlqueue_orm.ops_connection import OpsConnection

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["POLL_INTERVAL", "ControlPoller", "Controlled"]

log = logging.getLogger(__name__)

#: Seconds between two reads of the control row (a change takes effect within this, plus the
#: message in flight of a worker that shrinking ends).
POLL_INTERVAL = 0.5
#: Seconds between two looks for a control table that did not exist (a catalog look-up, not a
#: failing query twice a second in the server's log).
MISSING_TABLE_INTERVAL = 10.0

class Controlled(Protocol):
    """What the poller drives: a pump, or the loop of an :class:`~sqlqueue_orm.aio.AsyncEndpoint`.

    :class:`~sqlqueue_orm.receiving.pump.MessagePump` is one as it is.
    """

    @property
    def concurrency(self) -> int:
        """Messages handled at once at most, now."""

    def resize(self, concurrency: int) -> None:
        """Handle at most *concurrency* messages at once from now on."""

    def set_paused(self, paused: bool) -> None:
        """Start no receive (handlers in flight finish), or receive again."""


class ControlPoller:
    """Reads one endpoint's control row and applies it to its pumps (see the module docstring).

    :param endpoint: the endpoint's name (its control row's key).
    :param engine: the database of the control table.
    :param main: the input queue's pump (paused, and resized by the override).
    :param others: other pumps of the endpoint (paused only: the instance-specific queue's).
    :param interval: seconds between reads.
    """

    def __init__(
        self,
        endpoint: str,
        engine: Engine,
        main: Controlled,
        others: Sequence[Controlled],
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.endpoint = endpoint
        self.engine = engine
        self.main = main
        self.pumps = [main, *others]
        self.interval = interval
        #: The main pump's concurrency without an override.
        self.configured = main.concurrency
        #: What is applied now (the last state read).
        self.paused = False
        self.concurrency = main.concurrency
        #: Reads that failed in a row (the first is logged as a warning, the rest at debug).
        self.failures = 0
        #: When to look for the control table again (monotonic seconds); None: it exists.
        self._look_again: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The connection the endpoint's operations threads keep (this one and its health
        #: writer's): a poll is one primary-key read on it, alone in autocommit.
        self.ops = OpsConnection(engine)
        self._read = control.read_statement(engine.dialect)

    def prepare(self, create: bool) -> None:
        """Before the pumps start: create the control table if asked, read the row, apply it."""
        if create:
            try:
                control.create_tables(self.engine, log_too=False)
            except Exception as error:  # reading below reports it, and polling goes on
                log.debug("queue %s: creating the control table: %s", self.endpoint, error)
        elif not self._table_exists():
            log.info(
                "queue %s: no table %s: live control (`sqlqueue control`) is off until "
                "`sqlqueue migrate` creates it",
                self.endpoint,
                control.CONTROL_TABLE.name,
            )
            return
        self.poll()

    def _table_exists(self) -> bool:
        """Whether the control table exists; if not, look again in a while (not every poll)."""
        try:
            with db.reading(self.engine) as connection:
                found = sa.inspect(connection).has_table(control.CONTROL_TABLE.name)
        except Exception:  # unreachable: the read reports it
            return True
        self._look_again = None if found else time.monotonic() + MISSING_TABLE_INTERVAL
        return found

    def start(self) -> None:
        """Start reading every :attr:`interval` seconds (a daemon thread)."""
        self._thread = threading.Thread(
            target=self._run, name=f"{self.endpoint} control", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (the pumps keep the state last applied)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        """Read the row once and apply it; on a database error keep the last state."""
        if self._look_again is not None and (
            time.monotonic() < self._look_again or not self._table_exists()
        ):
            return
        try:
            found = self._read_row()
        except Exception as error:
            self.failures += 1
            level = logging.WARNING if self.failures == 1 else logging.DEBUG
            log.log(
                level,
                "queue %s: cannot read the endpoint's control row (%s); keeping %s "
                "(tried again every %.1f s)",
                self.endpoint,
                db.driver_cause(error),
                self._described(),
                self.interval,
            )
            return
        if self.failures:
            log.info("queue %s: the endpoint's control row is readable again", self.endpoint)
            self.failures = 0
        paused, concurrency, by = found if found is not None else (False, None, "")
        self.apply(paused, concurrency, by)

    def _read_row(self) -> tuple[bool, int | None, str] | None:
        if not self.ops.observed():
            with self.ops.statement(wait=self.interval) as cursor:
                if cursor is not None:
                    cursor.execute(self._read.text, self._read.params({"endpoint": self.endpoint}))
                    row = cursor.fetchone()
                    return None if row is None else (bool(row[0]), row[1], str(row[2]))
        # observed (through SQLAlchemy, so its cursor events see the read), or the health
        # writer's statement still holds the kept connection: a connection of the pool
        with db.reading(self.engine) as connection:
            found = control.read_control(connection, self.endpoint)
            if connection.in_transaction():
                connection.rollback()
        return found

    def apply(self, paused: bool, concurrency: int | None, by: str = "") -> None:
        """Make the pumps paused or not, and the main pump's concurrency *concurrency*."""
        wanted = self.configured if concurrency is None else concurrency
        who = f" (changed by {by})" if by else ""
        if wanted != self.concurrency:
            log.info(
                "queue %s: concurrency %d -> %d%s", self.endpoint, self.concurrency, wanted, who
            )
            self.main.resize(wanted)
            self.concurrency = wanted
        if paused != self.paused:
            log.info("queue %s: %s%s", self.endpoint, "paused" if paused else "resumed", who)
            for pump in self.pumps:
                pump.set_paused(paused)
            self.paused = paused

    def _described(self) -> str:
        state = "paused" if self.paused else "running"
        return f"{state}, concurrency {self.concurrency}"
