"""``engine.begin()``'s guarantee on a SQLAlchemy Connection the calling thread keeps.

``with engine.begin() as connection:`` checks a connection out of the pool, wraps it in a new
:class:`~sqlalchemy.engine.Connection`, begins, commits (or rolls back) and checks it back in:
on a receive of one message that is most of what the library adds to the driver's own BEGIN and
COMMIT. :meth:`KeptConnections.begin` gives the same block (the same Connection API, the same
commit on success and rollback on failure, with SQLAlchemy's events, sessions bound to the
connection and invalidation behaving as there) on a Connection the thread keeps from one block
to the next:

* a thread keeps at most one, counted in the budget of the transport's own kept connections
  (:meth:`~sqlqueue_orm.connections.ThreadConnections.reserve`, half the pool); when the budget
  is spent, or the thread's is in use (a block inside a block), the block gets a connection of
  its own, exactly as ``engine.begin()`` does;
* after a block that raised, whose connection was invalidated or closed, that ended or changed
  its transaction itself, or after :data:`~sqlqueue_orm.keeping.KEEP_MOST` blocks (so the
  pool's own checks still run), the connection goes back to the pool and the next block takes
  another;
* it goes back when the thread ends (its ``threading.local`` lets go) or on :meth:`close`; a
  forked child never uses (nor closes) the connection its parent kept.

On a kept connection the SQLAlchemy transaction object outlives the block: the first block
begins it (``connection.begin()``, entered as ``engine.begin()`` enters it), and a block that
ends normally commits by the steps of SQLAlchemy's own COMMIT of the connection (its "commit"
event, its echo line, the dialect's ``do_commit``, its error handling) while the object stays
open for the next block, which begins by the steps of SQLAlchemy's own BEGIN (its "begin"
event, the dialect's ``do_begin``: SQLite's ``BEGIN IMMEDIATE``; with no listener and a
``do_begin`` that does nothing, as on psycopg and pyodbc, nothing at all: the driver begins with
the block's first statement). Each block is still one database transaction, and
inside it the connection is in that transaction as SQLAlchemy sees it, so a Session bound to it
joins and never commits it. What is saved is the creation, the context handling and the ending
of a transaction object per block: on a receive of one message, the larger part of what a block
cost beyond the driver's BEGIN and COMMIT. Any other ending (the block raised, committed or
rolled back by itself, left a SAVEPOINT open, lost its connection) is ``engine.begin()``'s own
ending of that object, and the connection then goes back to the pool.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Engine, RootTransaction
from sqlalchemy.engine.default import DefaultDialect

from sqlqueue_orm import keeping, sqlalchemy_internals


class Transaction(Protocol):
    """A transaction begun for some work: a SQLAlchemy ``RootTransaction``, or a KeptRoot."""

    def commit(self) -> None:
        """Commit it."""

    def rollback(self) -> None:
        """Roll it back."""


def driver_begins(engine: Engine) -> bool:
    """Whether *engine*'s dialect leaves BEGIN to the driver (its ``do_begin`` does nothing).

    SQLAlchemy's default ``do_begin``; psycopg and pyodbc begin with the first statement.
    """
    return getattr(engine.dialect.do_begin, "__func__", None) is DefaultDialect.do_begin


class KeptRoot:
    """A connection's transactions, one after another, under one SQLAlchemy transaction object.

    :meth:`begin` returns it begun; :meth:`commit` and :meth:`rollback` end it as a
    ``RootTransaction``'s would (the endpoint's workers use it on the connection they keep).
    A commit keeps the object open for the next :meth:`begin`; a rollback, or a commit of a
    transaction the work changed (see :func:`~sqlqueue_orm.sqlalchemy_internals.commit_kept`),
    ends it through SQLAlchemy, and the next :meth:`begin` makes a new one.
    """

    __slots__ = ("_begins_itself", "connection", "open", "root")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._begins_itself = driver_begins(connection.engine)
        self.root: RootTransaction | None = None
        #: Whether a transaction :meth:`begin` began is neither committed nor rolled back.
        self.open = False

    def begin(self) -> KeptRoot:
        """Begin a database transaction on the connection; return this object."""
        root, connection = self.root, self.connection
        if not sqlalchemy_internals.is_current(root, connection):
            self.root = connection.begin()
        else:
            sqlalchemy_internals.begin_again(connection, root, self._begins_itself)
        self.open = True
        return self

    def commit(self) -> None:
        """Commit the transaction :meth:`begin` began."""
        self.open = False
        if not sqlalchemy_internals.commit_kept(self.connection, self.root):
            root, self.root = self.root, None
            if root is not None:
                root.commit()  # SQLAlchemy's own, whatever the work did with the transaction

    def rollback(self) -> None:
        """Roll the transaction back (through SQLAlchemy; the next begin makes a new object)."""
        self.open = False
        root, self.root = self.root, None
        if root is not None:
            root.rollback()


class KeptConnections:
    """Per-thread SQLAlchemy Connections for :meth:`begin` blocks (see the module docstring).

    :param engine: the engine the connections come from.
    :param reserve: count one more kept connection if the shared budget allows (True).
    :param unreserve: a counted connection went back to the pool.
    :param translate: the exception to raise for a driver error while a block begins (no
        connection to be had, a dead one), else SQLAlchemy's own is raised. The block's own
        statements and its commit raise SQLAlchemy's errors, as in ``engine.begin()``.
    """

    def __init__(
        self,
        engine: Engine,
        reserve: Callable[[], bool],
        unreserve: Callable[[], None],
        translate: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        self.engine = engine
        self.translate = translate
        #: Whether the dialect's do_begin is SQLAlchemy's default, which does nothing: the
        #: driver begins a transaction by itself with its first statement (psycopg, pyodbc).
        self.driver_begins = driver_begins(engine)
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
            if kept.inherited():  # from the parent process
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
    """The ``with`` block of :meth:`KeptConnections.begin` (a class: cheap to enter).

    On a kept connection a block begins by :func:`~sqlqueue_orm.sqlalchemy_internals.begin_again`
    and commits by :func:`~sqlqueue_orm.sqlalchemy_internals.commit_kept`
    (``tests/integration/test_transport_begin.py`` pins what they do).
    """

    __slots__ = ("_connection", "_connections", "_kept", "_transaction")

    def __init__(self, connections: KeptConnections) -> None:
        self._connections = connections

    def __enter__(self) -> Connection:
        try:
            return self._enter()
        except (exc.DBAPIError, exc.TimeoutError) as error:
            translate = self._connections.translate
            if translate is None:
                raise
            raise translate(error) from error

    def _enter(self) -> Connection:
        connections = self._connections
        kept = self._kept = connections.take()
        if kept is None:  # a connection of its own: exactly engine.begin()
            connection = self._connection = connections.engine.connect()
            try:
                self._transaction = connection.begin().__enter__()
            except BaseException:
                connection.close()
                raise
            return connection
        connection = self._connection = kept.connection
        try:
            root = kept.root
            if root is None:
                # as `with connection.begin():` does, so SQLAlchemy sees the same block
                kept.root = connection.begin().__enter__()
            else:
                sqlalchemy_internals.begin_again(connection, root, connections.driver_begins)
        except BaseException:
            self._give_back(failed=True)
            raise
        return connection

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
        kept = self._kept
        if kept is None:
            try:
                # SQLAlchemy's own ending of engine.begin()'s block: commit, or roll back on
                # error (and on a failed commit), whatever the block did with the transaction
                self._transaction.__exit__(kind, error, trace)
            finally:
                self._connection.close()
            return
        connection, root = self._connection, kept.root
        if kind is None:
            try:
                committed = sqlalchemy_internals.commit_kept(connection, root)
            except BaseException:
                self._give_back(failed=True)
                raise
            if committed:
                kept.busy = False
                if kept.used():
                    self._connections.drop(kept)
                return
        # The block raised, or ended or changed the transaction itself: engine.begin()'s ending.
        failed = kind is not None
        kept.root = None
        try:
            if root is not None:
                root.__exit__(kind, error, trace)
        except BaseException:
            failed = True
            raise
        finally:
            self._give_back(failed)

    def _give_back(self, failed: bool) -> None:
        kept = self._kept
        assert kept is not None
        kept.busy = False
        connection = self._connection
        if (
            kept.used()
            or failed  # its state is not known: the next block takes another
            or kept.root is None  # ended otherwise than by the kept COMMIT
            or connection.invalidated
            or connection.closed
        ):
            self._connections.drop(kept)


class _Kept(keeping.KeptConnection[Connection]):
    """A thread's kept Connection (given back to the pool when dropped) and its block's state."""

    __slots__ = ("busy", "root")

    def __init__(self, connection: Connection, unreserve: Callable[[], None]) -> None:
        super().__init__(connection, unreserve)
        #: The SQLAlchemy transaction the blocks run under (see the module docstring), or None.
        self.root: RootTransaction | None = None
        #: Whether a block runs on it now.
        self.busy = False

    def close(self, dead: bool = False) -> None:
        """Give the connection back to the pool (an open transaction is rolled back)."""
        self.root = None
        super().close(dead)
