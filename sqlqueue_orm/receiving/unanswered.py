"""When the database stops answering: say so, and drop the connections waiting on it.

A link that goes silent (packets dropped, no reset: a failed switch, a cloud network) leaves a
statement sent into it waiting for a reply that does not come. The kernel gives up only when
the dialect's connection parameters say (``tcp_user_timeout``, keepalives: see
``connect_defaults`` in :mod:`sqlqueue_orm.dialects`), and a statement already sent, once the
link is back, waits for TCP's next retransmission, which backs off to minutes. This watchdog
bounds the wait at the endpoint's pace, on databases whose driver tells whether a connection
waits on a statement (``DialectSupport.tells_statement_waiting``: PostgreSQL):

* a thread looks at the connections of the endpoint's engine (each one checked out since the
  start) every :func:`check_interval` seconds;
* a connection seen waiting on a statement for ``unanswered_after`` seconds makes it open a new
  connection to the database. When that one connects within ``unanswered_after`` too (or is
  refused: an answer), the database answers and is only busy: nothing is done, and a handler's
  long statement runs on;
* when it does not, the watchdog logs a warning naming the database and shuts down the sockets
  of the connections still waiting: their statements fail at once with the driver's
  lost-connection error, the pool discards them (a disconnect to SQLAlchemy), and the circuit
  breakers count the failures, raising their critical error after ``critical_error_after``. A
  receive whose connection was dropped is rolled back by the server: its message returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sqlqueue_orm import dialects, sqlalchemy_internals

log = logging.getLogger(__name__)

#: Words of a failed connection attempt that got no answer (rather than a refusal).
_NO_ANSWER = ("timeout", "timed out")


def check_interval(after: float) -> float:
    """Seconds between two looks at the connections: a quarter of *after*, at most one."""
    return min(1.0, after / 4)


class Watchdog:
    """Drops the connections of *engine* waiting on a database that does not answer.

    :param after: seconds a statement may wait for its result before the database is asked,
        with a new connection, whether it answers at all (``unanswered_after``).
    :param probe: the engine that new connection comes from (default *engine*): a synchronous
        one of the same database where *engine* is an asyncio engine's, whose driver
        connects only on the event loop.
    """

    def __init__(self, engine: Engine, after: float, probe: Engine | None = None) -> None:
        self.engine = engine
        self.after = after
        self.probe = engine if probe is None else probe
        self.support = dialects.for_dialect(engine)
        self.database = engine.url.render_as_string(hide_password=True)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()  # checkouts add from any thread while check() copies
        #: Per connection seen waiting: since when (it stopped waiting in between: removed).
        self._waiting: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._unanswered = False
        self._asked = 0.0
        #: Times the watchdog found the database not answering and dropped connections.
        self.cuts = 0

    def start(self) -> None:
        """Watch the connections checked out from now on (nothing where the driver cannot tell)."""
        if not self.support.tells_statement_waiting or self._thread is not None:
            return
        sa.event.listen(self.engine, "checkout", self._checked_out)
        self._thread = threading.Thread(target=self._run, name="unanswered watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        thread.join(5)
        with contextlib.suppress(sa.exc.InvalidRequestError):  # removed already
            sa.event.remove(self.engine, "checkout", self._checked_out)

    def _checked_out(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # an asyncio engine's connection is SQLAlchemy's adapter: the driver's is watched
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        with self._lock, contextlib.suppress(TypeError):  # no weak reference: not watched
            self._connections.add(driver)

    def _run(self) -> None:
        interval = check_interval(self.after)
        while not self._stopping.wait(interval):
            try:
                self.check()
            except Exception:  # a bug: say so, and go on watching
                log.exception("the watchdog of database %s failed", self.database)

    def check(self) -> None:
        """One look at the connections: ask the database when one waited too long."""
        now = time.monotonic()
        waiting = self.support.statement_waiting
        overdue = []
        with self._lock:
            watched = list(self._connections)
        for connection in watched:
            if not waiting(connection):
                self._waiting.pop(connection, None)
                continue
            since = self._waiting.setdefault(connection, now)
            if now - since >= self.after:
                overdue.append(connection)
        if not overdue or now - self._asked < self.after:
            return
        self._asked = now
        if self._answers():
            if self._unanswered:
                self._unanswered = False
                log.info("database %s answers again", self.database)
            for connection in overdue:  # busy, not gone: look again after another wait
                self._waiting[connection] = time.monotonic()
            return
        dropped = [connection for connection in overdue if waiting(connection)]
        self._unanswered = True
        self.cuts += 1
        log.warning(
            "database %s does not answer: %d connection(s) waited %g s or more for a "
            "statement's result, and a new connection got no answer in %g s; dropping them",
            self.database,
            len(dropped),
            self.after,
            self.after,
        )
        for connection in dropped:
            self._waiting.pop(connection, None)
            self._shut(connection)

    def _answers(self) -> bool:
        """Whether a new connection to the database is answered within :attr:`after`."""
        answered = threading.Event()

        def ask() -> None:
            try:
                connection = sqlalchemy_internals.new_driver_connection(self.probe)
            except Exception as error:  # refused or failed: an answer, unless none came
                if not any(word in str(error).lower() for word in _NO_ANSWER):
                    answered.set()
                return
            answered.set()
            with contextlib.suppress(Exception):
                connection.close()

        threading.Thread(target=ask, name="unanswered probe", daemon=True).start()
        return answered.wait(self.after)

    def _shut(self, connection: Any) -> None:
        """Shut down *connection*'s socket: the statement waiting on it fails at once."""
        fd = self.support.socket_of(connection)
        if fd is None or fd < 0:
            return
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()
