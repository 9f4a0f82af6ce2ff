"""SQLite: an idle pump sees another process's commit within milliseconds, reading no table.

``PRAGMA data_version`` (the dialect's
:attr:`~sqlqueue_orm.dialects.base.DialectSupport.commit_counter`) on a connection kept for
the purpose changes when any other connection commits to the database file. When the pump goes
idle it reads the value once, before its confirming peek; then, while it sleeps, a thread of
this module reads it every :data:`INTERVAL` seconds, and a change makes the pump peek. The
statement reads no table and holds no read transaction once it returns (the
connection is in autocommit), so it pins no WAL. While the pump has work the thread only
waits.

A change is any commit, to any table (a receive included): at worst a peek that finds
nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from sqlqueue_orm import addressing

log = logging.getLogger(__name__)

#: Seconds between two reads of the commit counter while the pump sleeps.
INTERVAL = 0.004


def _nothing() -> None:
    """Before :meth:`CommitWatcher.start`: nothing to nudge."""


class CommitWatcher:
    """Watches the database file's commit counter for one idle pump (module docstring)."""

    polls = False

    def __init__(
        self,
        engine: Engine,
        address: addressing.QueueAddress,
        statement: str,
        interval: float | None = None,
    ) -> None:
        self.engine = engine
        self.address = address
        self.statement = statement
        self.interval = INTERVAL if interval is None else interval
        #: Set once the watching connection is open.
        self.listening = threading.Event()
        self._nudge: Callable[[], None] = _nothing
        self._stopping = threading.Event()
        self._armed = threading.Event()
        self._lock = threading.Lock()  # the connection, used by the loop thread and ours
        self._driver: Any = None
        self._seen: object = None
        self._thread: threading.Thread | None = None

    def start(self, wake: Callable[[], None], nudge: Callable[[], None]) -> None:
        """Open the watching connection and start the thread; *nudge* makes the pump peek."""
        self._nudge = nudge
        raw = self.engine.raw_connection()
        self._driver = raw.driver_connection
        raw.detach()  # ours for good: the pool opens another in its place
        self.listening.set()
        self._thread = threading.Thread(
            target=self._run, name=f"{self.address.table} commit watcher", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and close the connection."""
        self._stopping.set()
        self._armed.set()
        if self._thread is not None:
            self._thread.join(2.0)
        with self._lock:
            driver, self._driver = self._driver, None
            self.listening.clear()
            if driver is not None:
                driver.close()

    def idle(self, delay: float) -> float | None:
        """Note the counter (then the pump peeks once more: None), or the seconds to sleep."""
        if self._armed.is_set():
            return delay
        self._seen = self._read()
        if self._seen is None:
            return delay  # cannot read it: the pump polls
        self._armed.set()
        return None

    def busy(self) -> None:
        """The pump has work: stop watching until it is idle again."""
        self._armed.clear()

    def _read(self) -> object:
        with self._lock:
            driver = self._driver
            if driver is None:
                return None
            try:
                cursor = driver.execute(self.statement)
                try:
                    row = cursor.fetchone()
                finally:
                    cursor.close()
            except Exception as error:  # the database busy or gone: the peeks say which
                log.debug("queue %s: reading the commit counter: %s", self.address, error)
                return None
        return None if row is None else row[0]

    def _run(self) -> None:
        stopping = self._stopping
        while not stopping.is_set():
            if not self._armed.wait(1.0):
                continue
            stopping.wait(self.interval)
            if not self._armed.is_set():
                continue
            value = self._read()
            if value is not None and value != self._seen:
                self._seen = value
                self._nudge()
