"""Every use of SQLAlchemy's private names, in one place.

SQLAlchemy has no public API for a few things the hot path needs: beginning and committing a
database transaction under a transaction object that stays open (:func:`begin_again`,
:func:`commit_kept`), telling whether events or SQL echo would see a statement (cheaply, on
every transaction), a pool's overflow limit, a connection made as the pool makes one but
outside it, the dialects an index's ``ddl_if`` names, a column copied off its table,
synchronous code awaited on an asyncio engine (:func:`greenlet_spawn`), a coroutine awaited
from it (:func:`await_in_greenlet`), and a sleep and a lock's wait there (:func:`sleep`,
:func:`acquire`). The rest of the package calls the functions here and never reaches into
SQLAlchemy itself.

The names and signatures this module relies on are checked against the installed SQLAlchemy by
``tests/unit/test_sqlalchemy_internals.py``; ``pyproject.toml`` bounds SQLAlchemy to the series
CI runs (its lowest and newest releases), so a release that renames one fails a test, not a
transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeGuard, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, RootTransaction
from sqlalchemy.pool import QueuePool

T = TypeVar("T")

#: What this module reads or calls, by class: the names the test checks exist.
RELIED_ON: dict[str, tuple[str, ...]] = {
    "Connection": (
        "_begin_impl", "_commit_impl", "_handle_dbapi_exception", "_transaction",
        "_nested_transaction", "_dbapi_connection", "_has_events", "_echo",
    ),
    "Engine": ("_has_events", "_should_log_info"),
    "QueuePool": ("_max_overflow", "_invoke_creator"),
    "DialectKWArgs": ("_ddl_if",),
    "Column": ("_copy",),
}


#: Seconds between two tries of a lock that a task of the event loop waits for (:func:`acquire`).
_LOCK_POLL = 0.001

def observed(connection: Connection) -> bool:
    """Whether SQLAlchemy's BEGIN and COMMIT do more here than the dialect's (events, echo)."""
    return bool(connection._has_events or connection.engine._has_events or connection._echo)


def statements_observed(connection: Connection) -> bool:
    """Whether cursor events or SQL echo would see a statement run on *connection*.

    The checks follow SQLAlchemy's own (``_has_events`` first): the connection's dispatch joins
    the engine's lazily, at a cost per new Connection, so it is read only when listeners were
    added to the connection itself.
    """
    if connection._echo:  # echo=True, or SQL logging switched on (as SQLAlchemy reads it)
        return True
    if connection._has_events:
        dispatch: Any = connection.dispatch
        if dispatch.before_cursor_execute or dispatch.after_cursor_execute:
            return True
    return engine_statements_observed(connection.engine)


def engine_statements_observed(engine: Engine) -> bool:
    """Whether the engine's cursor events would see a statement (SQL echo not counted)."""
    dispatch: Any = engine.dispatch
    return bool(
        engine._has_events and (dispatch.before_cursor_execute or dispatch.after_cursor_execute)
    )


def engine_observed(engine: Engine) -> bool:
    """Whether cursor events or SQL echo (``echo=True``, SQL logging) would see a statement."""
    return engine_statements_observed(engine) or bool(engine._should_log_info())


def is_current(root: RootTransaction | None, connection: Connection) -> TypeGuard[RootTransaction]:
    """Whether *root* is *connection*'s current transaction object, still active."""
    return root is not None and root.is_active and connection._transaction is root


# begin_again and commit_kept take the steps of SQLAlchemy's Connection.begin() and
# Transaction.commit() without their transaction object: they read a few of the Connection's
# attributes and call its _begin_impl, _commit_impl and _handle_dbapi_exception.


def begin_again(connection: Connection, root: RootTransaction, begins_itself: bool) -> None:
    """Begin the next database transaction under *root*, kept open since the last COMMIT.

    SQLAlchemy's own BEGIN of the connection (the "begin" event, the echo line, the dialect's
    ``do_begin``, its error handling), skipped when it would do nothing: *begins_itself* (the
    driver begins with the first statement) and nobody listens.
    """
    if not begins_itself or observed(connection):
        connection._begin_impl(root)


def commit_kept(connection: Connection, root: RootTransaction | None) -> bool:
    """COMMIT the database transaction and keep *root* open for the next one.

    The steps of SQLAlchemy's own COMMIT of the connection (the "commit" event, the echo line,
    the dialect's ``do_commit``; a failure wrapped, the connection invalidated if it is gone).
    Return False, having done nothing, when the transaction is not as *root* began it: *root*
    ended or replaced, a SAVEPOINT still open, the connection invalidated or closed; the
    caller then ends it as SQLAlchemy would.
    """
    if not (
        root is not None
        and root.is_active
        and connection._transaction is root
        and connection._nested_transaction is None
        and connection._dbapi_connection is not None
    ):
        return False
    if observed(connection):
        connection._commit_impl()
    else:
        try:
            connection.dialect.do_commit(connection._dbapi_connection)
        except BaseException as failure:  # wrapped, invalidated if disconnected
            connection._handle_dbapi_exception(failure, None, None, None, None)
    return True


def greenlet_spawn(function: Callable[..., T], *args: Any) -> Awaitable[T]:
    """Await ``function(*args)``, synchronous code that may use an asyncio engine's connections.

    SQLAlchemy's own bridge (``sqlalchemy.util.greenlet_spawn``, what ``run_sync`` calls),
    undocumented: for synchronous code that opens its own connections, so that no connection
    is held just to reach ``run_sync``.
    """
    from sqlalchemy.util import greenlet_spawn as spawn

    return spawn(function, *args)


def await_in_greenlet(awaitable: Awaitable[T]) -> T:
    """Await *awaitable* from synchronous code that :func:`greenlet_spawn` runs.

    SQLAlchemy's own ``sqlalchemy.util.await_`` (what its asyncio drivers' adapters call):
    the synchronous code pauses, the event loop runs *awaitable*, and its result (or its
    exception) comes back to the synchronous code.
    """
    from sqlalchemy.util import await_

    return await_(awaitable)


def sleep(seconds: float) -> None:
    """Wait *seconds*; in code :func:`greenlet_spawn` runs, with the event loop running on.

    There ``asyncio.sleep`` is awaited (SQLAlchemy's ``in_greenlet`` tells where), elsewhere
    ``time.sleep`` is called: flow control's waits run on a pump's worker thread, or in the
    asyncio endpoint's bridge, where a blocking sleep would stop every task of the loop.
    """
    from sqlalchemy.util.concurrency import in_greenlet

    if in_greenlet():
        await_in_greenlet(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def acquire(lock: threading.Lock | threading.Semaphore, timeout: float | None = None) -> bool:
    """Take *lock* (waiting up to *timeout* s, None: as long as it takes); return whether taken.

    In code :func:`greenlet_spawn` runs, another task of the event loop may hold it across a
    statement it awaits: waiting there is a poll that lets the loop run on (a blocking wait
    would stop the loop, so the holder's statement, and the wait, would never end).
    """
    from sqlalchemy.util.concurrency import in_greenlet

    if not in_greenlet():
        return lock.acquire(timeout=-1 if timeout is None else timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not lock.acquire(blocking=False):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        await_in_greenlet(asyncio.sleep(_LOCK_POLL))
    return True


@contextlib.contextmanager
def holding(lock: threading.Lock) -> Iterator[None]:
    """``with lock:``, taken by :func:`acquire` (the event loop runs on while it waits)."""
    acquire(lock)
    try:
        yield
    finally:
        lock.release()


def max_overflow(pool: QueuePool) -> int:
    """The pool's overflow limit (-1: no limit); SQLAlchemy names no public accessor."""
    return int(pool._max_overflow)


def new_driver_connection(engine: Engine) -> Any:
    """A new DBAPI connection made as the engine's pool makes one, outside the pool.

    The URL's arguments, ``connect_args`` and ``do_connect`` listeners apply; the caller closes
    it. (A probe that must not wait behind, or take, a pooled connection.)
    """
    return engine.pool._invoke_creator(None)  # type: ignore[arg-type]


def copied_column(column: sa.Column[Any]) -> sa.Column[Any]:
    """A copy of *column* bound to no table (what ``op.add_column`` adds).

    SQLAlchemy names no public way to copy a column.
    """
    return column._copy()


def ddl_if_dialects(element: Any) -> str | tuple[str, ...] | None:
    """The dialect or dialects *element*'s ``ddl_if(dialect=...)`` names, or None (every one)."""
    ddl_if = getattr(element, "_ddl_if", None)
    if ddl_if is None or ddl_if.dialect is None:
        return None
    allowed = ddl_if.dialect
    return allowed if isinstance(allowed, str) else tuple(allowed)
