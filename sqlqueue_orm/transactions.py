"""``engine.begin()``'s guarantee on a SQLAlchemy Connection the calling thread keeps.

``with engine.begin() as connection:`` checks a connection out of the pool, wraps it in a new
:class:`~sqlalchemy.engine.Connection`, begins, commits (or rolls back) and checks it back in:
on a receive of one message that is most of what the library adds to the driver's own BEGIN and
COMMIT. :meth:`KeptConnections.begin` gives the same block (the same Connection API, the same
commit on success and rollback on failure, through SQLAlchemy's own transaction object, so
events, sessions bound to the connection and invalidation behave as there) on a Connection the
thread keeps from one block to the next:

* a thread keeps at most one, counted in the budget of the transport's own kept connections
  (:meth:`~sqlqueue_orm.connections.ThreadConnections.reserve`, half the pool); when the budget
  is spent, or the thread's is in use (a block inside a block), the block gets a connection of
  its own, exactly as ``engine.begin()`` does;
* after a block that raised, whose connection was invalidated or closed, that left a
  transaction open, or after :data:`KEEP_MOST` blocks (so the pool's own checks still run),
  the connection goes back to the pool and the next block takes another;
* it goes back when the thread ends (its ``threading.local`` lets go) or on :meth:`close`; a
  forked child never uses (nor closes) the connection its parent kept.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection, Engine

#: Most blocks one kept connection serves before it goes back to the pool (as the pump's
#: workers do), so ``pool_pre_ping`` and ``pool_recycle`` still see it under steady load.
KEEP_MOST = 1_000


class KeptConnections:
    """Per-thread SQLAlchemy Connections for :meth:`begin` blocks (see the module docstring).

    :param engine: the engine the connections come from.
    :param reserve: count one more kept connection if the shared budget allows (True).
    :param unreserve: a counted connection went back to the pool.
    """

    def __init__(
        self, engine: Engine, reserve: Callable[[], bool], unreserve: Callable[[], None]
    ) -> None:
        self.engine = engine
        self._reserve = reserve
        self._unreserve = unreserve
        self._local = threading.local()
        # Weak: a thread that ends drops its _Kept, whose __del__ gives the connection back.
        self._all: weakref.WeakSet[_Kept] = weakref.WeakSet()
        # Connections a forked child inherited: never touched, kept from the garbage collector
        # (whose clean-up would reach the parent's socket).
        self._inherited: list[_Kept] = []

    def begin(self) -> KeptTransaction:
        """A transaction block on this thread's kept connection (``with`` yields it)."""
        return KeptTransaction(self)

    def close(self) -> None:
        """Give back every connection threads keep (call when no block is running)."""
        for kept in list(self._all):
            kept.close()
        self._local = threading.local()

    def take(self) -> _Kept | None:
        """The calling thread's free kept connection (made now if the budget allows), or None."""
        kept: _Kept | None = getattr(self._local, "kept", None)
        if kept is not None:
            if kept.pid != os.getpid():  # inherited from the parent process
                self._local.kept = None
                kept.abandon()
                self._inherited.append(kept)
            elif kept.busy:
                return None  # a block inside a block: the inner one gets its own
            else:
                kept.busy = True
                return kept
        if not self._reserve():
            return None
        try:
            connection = self.engine.connect()
        except BaseException:
            self._unreserve()
            raise
        kept = _Kept(connection, self._unreserve)
        kept.busy = True
        self._all.add(kept)
        self._local.kept = kept
        return kept

    def drop(self, kept: _Kept) -> None:
        """Give *kept* back to the pool: the thread's next block takes another."""
        if getattr(self._local, "kept", None) is kept:
            self._local.kept = None
        self._all.discard(kept)
        kept.close()


class KeptTransaction:
    """The ``with`` block of :meth:`KeptConnections.begin` (a class: cheap to enter)."""

    __slots__ = ("_connection", "_connections", "_kept", "_transaction")

    def __init__(self, connections: KeptConnections) -> None:
        self._connections = connections

    def __enter__(self) -> Connection:
        connections = self._connections
        kept = self._kept = connections.take()
        connection = self._connection = (
            kept.connection if kept is not None else connections.engine.connect()
        )
        try:
            # as `with connection.begin():` does, so SQLAlchemy sees the same block
            self._transaction = connection.begin().__enter__()
        except BaseException:
            self._give_back(failed=True)
            raise
        return connection

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
        failed = kind is not None
        try:
            # SQLAlchemy's own ending of engine.begin()'s block: commit, or roll back on error
            # (and on a failed commit), whatever the block did with the transaction.
            self._transaction.__exit__(kind, error, trace)
        except BaseException:
            failed = True
            raise
        finally:
            self._give_back(failed)

    def _give_back(self, failed: bool) -> None:
        kept, connection = self._kept, self._connection
        if kept is None:
            connection.close()
            return
        kept.busy = False
        kept.uses += 1
        if (
            failed  # its state is not known: the next block takes another
            or connection.invalidated
            or connection.closed
            or connection.in_transaction()  # (closing rolls it back, as engine.begin() does)
            or kept.uses >= KEEP_MOST
        ):
            self._connections.drop(kept)


class _Kept:
    """A thread's kept Connection; given back to the pool when dropped."""

    __slots__ = ("__weakref__", "_closed", "_unreserve", "busy", "connection", "pid", "uses")

    def __init__(self, connection: Connection, unreserve: Callable[[], None]) -> None:
        self.connection = connection
        self.pid = os.getpid()
        self.busy = False
        self.uses = 0
        self._closed = False
        self._unreserve = unreserve

    def close(self) -> None:
        """Give the connection back to the pool (an open transaction is rolled back)."""
        if self._closed:
            return
        self.abandon()
        self.connection.close()

    def abandon(self) -> None:
        """Forget the connection without touching it (it belongs to another process)."""
        if not self._closed:
            self._closed = True
            self._unreserve()

    def __del__(self) -> None:  # the thread ended: its threading.local let go of us
        try:
            self.close()
        except Exception:  # noqa: S110  (interpreter shutdown, a dead connection: nothing to do)
            pass
