"""One kept connection for an endpoint's operations threads: its control poller and health writer.

A running endpoint reads its control row twice a second and writes a heartbeat every few
seconds. Taken from the engine's pool each time, a read pays a checkout, its statement and a
ROLLBACK; and a pool the pump's workers keep busy may have no idle connection to give, so the
read would open (and the pool then close) a fresh server connection. :class:`OpsConnection`
instead keeps ONE DBAPI connection for both threads (a
:class:`~sqlqueue_orm.connections.HeldConnection`), checked out once and held for the endpoint's
life (it is not one of the pump's kept connections), used by one thread at a time:

* each statement runs alone in autocommit (the driver's flag on psycopg and pyodbc; sqlite3 as
  :func:`sqlqueue_orm.db.create_engine` sets it up runs a statement outside BEGIN in a
  transaction of its own, so a SQLite write holds the write lock only while it runs): a
  primary-key read or an UPDATE by key is one round trip;
* a database error drops the connection (invalidated, not pooled again), and the next statement
  connects anew: a restarted server costs one failed poll or beat, not the thread.

SQLAlchemy's cursor events (``echo``, instrumentation) fire only through a SQLAlchemy
``Connection``: callers ask :meth:`OpsConnection.observed` first and take the engine's path while
anyone listens, as for :class:`~sqlqueue_orm.connections.ThreadConnections`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import Engine

from sqlqueue_orm import connections
from sqlqueue_orm.queuing import sql

__all__ = ["OpsConnection"]


class OpsConnection:
    """A DBAPI connection of *engine* kept for single autocommit statements, shared by threads.

    :param engine: the engine the connection comes from (one checkout, held until :meth:`close`).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._mode = sql.for_dialect(engine.dialect).autocommit
        self._lock = threading.Lock()
        self._held: connections.HeldConnection | None = None
        self._autocommit = False
        self._observer = connections.ThreadConnections(engine)  # only for observed()
        #: Connections opened (the first, and one after each error that dropped the last).
        self.opened = 0

    def observed(self) -> bool:
        """Whether SQLAlchemy cursor events or SQL echo logging would see our statements."""
        return self._observer.observed()

    @contextlib.contextmanager
    def statement(self, wait: float | None = None) -> Iterator[Any]:
        """A DBAPI cursor for ONE statement, committed by itself (see the module docstring).

        Threads take turns: a second caller waits for the first one's statement.

        :param wait: seconds to wait for the other thread's statement at most (``None``: as
            long as it runs); past them the block gets ``None`` instead of a cursor (a beat
            waiting for SQLite's write lock must not hold up the control read).
        """
        if not self._lock.acquire(timeout=-1 if wait is None else wait):
            yield None
            return
        try:
            fairy = (self._held or self._open()).connection
            cursor = None
            try:
                cursor = fairy.cursor()
                yield cursor
                if not self._autocommit:  # a driver that could not autocommit: commit it
                    fairy.commit()
            except BaseException:
                self._drop(invalidate=True)
                raise
            finally:
                if cursor is not None:
                    with contextlib.suppress(Exception):
                        cursor.close()
        finally:
            self._lock.release()

    def _open(self) -> connections.HeldConnection:
        held = connections.HeldConnection(connections.raw_connection(self.engine))
        driver = held.driver
        autocommit = False
        if self._mode == "driver" and getattr(driver, "autocommit", None) is not None:
            held.set_autocommit(True)  # put back as it came when the connection is given back
            autocommit = True
        elif self._mode == "implicit":
            autocommit = getattr(driver, "isolation_level", "") is None and (
                getattr(driver, "autocommit", -1) is not False
            )
        self._held, self._autocommit = held, autocommit
        self.opened += 1
        return held

    def _drop(self, *, invalidate: bool) -> None:
        held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(Exception):
                held.close(dead=invalidate)  # a connection that failed is not pooled again

    def close(self) -> None:
        """Give the connection back to the pool (a later statement takes a new one)."""
        with self._lock:
            self._drop(invalidate=False)
