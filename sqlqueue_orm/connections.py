"""Short transactions of our own on pooled connections that threads keep between calls.

When the caller passes no connection, :class:`~sqlqueue_orm.transport.Transport` runs each send
or receive in a transaction of its own. :class:`ThreadConnections` hands those out:

* up to half the pool's size, a thread keeps its DBAPI connection between transactions, so a
  consumer loop pays no pool checkout per message; the connection goes back to the pool when the
  thread ends (its ``threading.local`` lets go) or :meth:`ThreadConnections.close` is called;
* a forked child never uses (nor closes) the socket it inherited from its parent;
* a connection that died is invalidated, not pooled again.

The fast form (:meth:`ThreadConnections.transaction`) runs statements on the DBAPI cursor,
skipping SQLAlchemy's per-transaction machinery. SQLAlchemy's cursor events (``echo=True``,
``before_cursor_execute`` listeners such as OpenTelemetry's instrumentation) only fire through a
:class:`~sqlalchemy.engine.Connection`, so callers ask :meth:`ThreadConnections.observed` first
and take ``engine.begin()`` while anyone is listening. This module never calls back into the
transport.

The driver-level calls on a SQLAlchemy :class:`~sqlalchemy.engine.Connection` live here too:
:func:`driver_cursor` (the hot path's statements on the DBAPI cursor of the caller's
transaction), :func:`rollback_on_driver`, :func:`direct_session` (whether the session's server
process is the one the driver connected to), and :class:`SessionLocks` with its pool
``checkin`` listener :func:`give_back_session_locks` (locks a connection holds for its session,
given back when it returns to the pool).
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import keeping, sqlalchemy_internals

log = logging.getLogger(__name__)


def raw_connection(engine: Engine) -> Any:
    """``engine.raw_connection()``, a failure to connect raised as SQLAlchemy's ``DBAPIError``.

    ``Engine.connect()`` wraps the driver's error this way; ``raw_connection()`` does not, and
    callers (the pump's circuit breakers, :func:`sqlqueue_orm.db.wrap_db_errors`) catch
    SQLAlchemy's errors, so an outage must look the same on both paths.
    """
    try:
        return engine.raw_connection()
    except engine.dialect.loaded_dbapi.Error as error:
        raise sa.exc.DBAPIError.instance(
            None, None, error, engine.dialect.loaded_dbapi.Error
        ) from error


def pool_has_room(engine: Engine, wanted: int) -> bool:
    """Whether *engine*'s pool could hand out *wanted* more connections now without waiting.

    True for a :class:`~sqlalchemy.pool.QueuePool` whose size plus overflow (none: no limit)
    leaves *wanted* beyond the connections checked out; False for any other pool (one
    connection per thread, or none kept), whose checkouts are not counted this way.
    """
    pool = engine.pool
    if not isinstance(pool, sa.pool.QueuePool):
        return False
    overflow = sqlalchemy_internals.max_overflow(pool)  # -1: no limit
    return overflow < 0 or pool.size() + overflow - pool.checkedout() >= wanted


class ThreadConnections:
    """Pooled DBAPI connections for short transactions, kept per thread up to a limit.

    :param engine: the engine whose pool the connections come from.
    :param begin_statement: a statement that opens each transaction (``BEGIN IMMEDIATE`` on
        SQLite, see :func:`sqlqueue_orm.db.create_engine`), or ``""`` to begin implicitly.
    :param translate: the exception to raise for a driver error of *begin_statement* (a
        SQLite write lock held past the busy timeout), else the driver's own is raised.
    """

    def __init__(
        self,
        engine: Engine,
        begin_statement: str = "",
        autocommit: str = "",
        translate: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        self.engine = engine
        self.begin_statement = begin_statement
        self.translate = translate
        if autocommit not in ("", "driver", "implicit"):
            raise ValueError(f"autocommit {autocommit!r} must be '', 'driver' or 'implicit'")
        self.autocommit = autocommit
        self._local = threading.local()
        # Weak: a thread that ends drops its HeldConnection, whose __del__ gives it back.
        self._held_all: weakref.WeakSet[HeldConnection] = weakref.WeakSet()
        self._held_count = 0
        # QueuePool.size() is a method; SingletonThreadPool (in-memory SQLite) has an int.
        size = getattr(engine.pool, "size", 2)
        pool_size = size() if callable(size) else size
        self._held_limit = max(1, int(pool_size) // 2)
        self._lock = threading.Lock()

    def observed(self) -> bool:
        """Whether SQLAlchemy cursor events or SQL echo logging would see our statements."""
        return sqlalchemy_internals.engine_observed(self.engine)

    def transaction(self) -> OwnTransaction:
        """A short transaction on a DBAPI cursor: ``with`` commits it, or rolls back on error."""
        return OwnTransaction(self)

    def statement(self) -> OwnTransaction | OwnStatement:
        """A DBAPI cursor for ONE statement, run in autocommit where the driver allows it.

        One statement is atomic on its own, so it needs no BEGIN/COMMIT round trips around it
        (a send of one message; a receive, which deletes and returns in one statement). Several
        statements, or an ``executemany`` (not atomic in autocommit), need :meth:`transaction`.
        Where the driver cannot autocommit, this is :meth:`transaction`.
        """
        if self.autocommit:
            return OwnStatement(self)
        return OwnTransaction(self)

    def close(self) -> None:
        """Give back every connection threads hold."""
        for held in list(self._held_all):
            held.close()
        self._local = threading.local()

    # -- used by OwnTransaction and OwnStatement ----------------------------------------------
    def checkout(self) -> tuple[Any, bool]:
        """A pooled DBAPI connection for this thread, and whether it stays with the thread."""
        held = self.held()
        if held is not None:
            return held.connection, True
        return raw_connection(self.engine), False

    def held(self) -> HeldConnection | None:
        """The connection this thread keeps (taken from the pool now if there is room), or None.

        None when the threads already hold :attr:`_held_limit` connections, or on an asyncio
        engine: the caller then takes one from the pool for this transaction only.
        """
        if self.engine.dialect.is_async:
            # an asyncio engine's: the tasks of one event loop share its thread, and one
            # driver connection runs one operation at a time, so none is kept per thread
            return None
        held: HeldConnection | None = getattr(self._local, "held", None)
        if held is not None:
            if not held.inherited():
                return held
            # A forked child inherited the parent's socket: never use it, never close it.
            self._local.held = None
            held.abandon()
        if not self.reserve():
            return None
        try:
            fairy = raw_connection(self.engine)
        except BaseException:
            self.unreserve()
            raise
        held = HeldConnection(fairy, self.unreserve)
        self._held_all.add(held)
        self._local.held = held
        return held

    def reserve(self) -> bool:
        """Count one more connection kept by a thread, if the budget has room (else False).

        The budget (half the pool) is shared with the connections that
        :mod:`sqlqueue_orm.transactions` keeps, so the kept ones never starve the pool.
        """
        with self._lock:
            if self._held_count >= self._held_limit:
                return False
            self._held_count += 1
            return True

    def unreserve(self) -> None:
        """A connection counted by :meth:`reserve` went back to the pool."""
        with self._lock:
            self._held_count -= 1

    def begin(self, fairy: Any, cursor: Any, kept: bool) -> None:
        """Open the transaction with :attr:`begin_statement`, if any; on failure give back."""
        if self.begin_statement:
            try:
                cursor.execute(self.begin_statement)
            except BaseException as error:
                self.end(fairy, cursor, kept, error)
                if self.translate is not None and isinstance(
                    error, self.engine.dialect.loaded_dbapi.Error
                ):
                    raise self.translate(error) from error
                raise

    def end(
        self,
        fairy: Any,
        cursor: Any,
        kept: bool,
        error: BaseException | None,
        committed: bool = False,
    ) -> None:
        """Finish a transaction: commit, or roll back on *error*; drop a dead connection.

        A connection the thread keeps (*kept*) keeps its cursor too, for the next statement,
        unless something failed.

        :param committed: the statement ran in autocommit: there is nothing to commit.
        """
        close_cursor = not kept
        try:
            if error is None:
                if not committed:
                    fairy.commit()
                if kept:
                    self._count_use(fairy)
                return
            close_cursor = True
            original = error.__cause__ or error
            dead = isinstance(original, Exception) and self.engine.dialect.is_disconnect(
                original,  # type: ignore[arg-type]
                fairy.dbapi_connection,
                cursor,
            )
            if not dead:
                try:
                    fairy.rollback()
                except Exception:  # the connection is unusable: drop it
                    dead = True
            if dead:
                held = getattr(self._local, "held", None)
                if held is not None and held.connection is fairy:
                    self._local.held = None
                    held.close(dead=True)
                else:
                    fairy.invalidate()
                    fairy.close()
                kept = True  # already given back
        except BaseException:
            close_cursor = True  # the commit failed: start the next one on a fresh cursor
            raise
        finally:
            if close_cursor:
                held = getattr(self._local, "held", None)
                if held is not None and held.cursor is cursor:
                    held.cursor = None
                try:
                    cursor.close()
                except Exception:  # noqa: S110  (a dead connection's cursor: nothing to free)
                    pass
            if not kept:
                fairy.close()


    def _count_use(self, fairy: Any) -> None:
        """Count a unit of work of this thread's kept connection; after KEEP_MOST, give it back.

        The next statement takes another from the pool, whose checks (``pool_pre_ping``,
        ``pool_recycle``) then see it. A :meth:`close` on another thread may have let go of
        the connection since the work committed: then there is nothing to count.
        """
        held: HeldConnection | None = getattr(self._local, "held", None)
        if held is None or held.connection is not fairy:
            return
        if held.used():
            self._local.held = None
            try:
                held.close()
            except Exception:  # noqa: S110  (the work committed: its caller must not see this)
                pass


class OwnTransaction:
    """The context manager of :meth:`ThreadConnections.transaction` (a class: cheap to enter)."""

    __slots__ = ("_connections", "_cursor", "_fairy", "_kept")

    def __init__(self, connections: ThreadConnections) -> None:
        self._connections = connections

    def __enter__(self) -> Any:
        connections = self._connections
        held = connections.held()
        if held is not None:
            self._fairy, self._kept = held.connection, True
            if held.autocommit_set:  # left on by OwnStatement: a transaction needs it off
                held.set_autocommit(False)
            self._cursor = cursor = held.cursor or held.new_cursor()
        else:
            self._fairy, self._kept = raw_connection(connections.engine), False
            self._cursor = cursor = self._fairy.cursor()
        connections.begin(self._fairy, cursor, self._kept)
        return cursor

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self._connections.end(self._fairy, self._cursor, self._kept, error)


class OwnStatement:
    """The context manager of :meth:`ThreadConnections.statement`: one statement in autocommit.

    ``"driver"``: the driver connection's ``autocommit`` flag (psycopg, pyodbc) is set for the
    statement (no round trip: both drivers set it locally). A connection the thread keeps stays
    in autocommit between statements and is put back as it came when the thread gives it back
    (or before an :class:`OwnTransaction` on it); any other goes back to the pool as it came.
    ``"implicit"``: the driver already runs a statement outside BEGIN in a transaction of its
    own (sqlite3 with ``isolation_level=None``, as :func:`sqlqueue_orm.db.create_engine` sets
    it). A driver in any other state gets the transaction :class:`OwnTransaction` would open.
    """

    __slots__ = ("_autocommit", "_connections", "_cursor", "_driver", "_fairy", "_kept",
                 "_restore")

    def __init__(self, connections: ThreadConnections) -> None:
        self._connections = connections

    def __enter__(self) -> Any:
        connections = self._connections
        held = connections.held()
        self._restore = False
        if held is not None:
            self._fairy, self._kept = fairy, _kept = held.connection, True
            self._cursor = cursor = held.cursor or held.new_cursor()
            driver = held.driver
        else:
            self._fairy, self._kept = fairy, _kept = raw_connection(connections.engine), False
            self._cursor = cursor = fairy.cursor()
            driver = fairy.driver_connection
        self._driver = driver
        if connections.autocommit == "driver":
            flag = getattr(driver, "autocommit", None)
            if flag is False:
                try:
                    driver.autocommit = True
                except AttributeError:  # psycopg's async connection: set only by a coroutine
                    flag = None  # so the statement runs in a transaction
                else:
                    if held is not None:
                        held.autocommit_set = True  # left on: put back when the thread lets go
                    else:
                        self._restore = True
            self._autocommit = flag is not None
        else:  # "implicit": sqlite3 outside its legacy transaction handling
            self._autocommit = (
                getattr(driver, "isolation_level", "") is None
                and getattr(driver, "autocommit", -1) is not False
            )
        if not self._autocommit:
            connections.begin(fairy, cursor, _kept)
        return cursor

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        if self._restore:
            try:
                self._driver.autocommit = False
            except Exception as restore_error:  # the connection is unusable: end() drops it
                error = error or restore_error
        # In autocommit the statement committed itself: nothing to commit.
        self._connections.end(self._fairy, self._cursor, self._kept, error,
                              committed=self._autocommit)


class HeldConnection(keeping.KeptConnection[Any]):
    """A pooled DBAPI connection kept between short transactions or single statements.

    A :class:`~sqlqueue_orm.keeping.KeptConnection` of a pool's DBAPI connection, as a thread
    of :class:`ThreadConnections` or an :class:`~sqlqueue_orm.ops_connection.OpsConnection`
    keeps it. It keeps one cursor for its statements (a new one after any failure) and may be
    left in the driver's autocommit (:attr:`autocommit_set`, by :class:`OwnStatement`); both
    are undone before the connection goes back to the pool.
    """

    __slots__ = ("autocommit_set", "cursor", "driver")

    def __init__(self, fairy: Any, on_release: Callable[[], None] | None = None) -> None:
        super().__init__(fairy, on_release)
        self.driver = fairy.driver_connection
        self.cursor: Any | None = None
        self.autocommit_set = False

    def new_cursor(self) -> Any:
        """A new cursor, kept for the statements that follow."""
        self.cursor = cursor = self.connection.cursor()
        return cursor

    def set_autocommit(self, value: bool) -> None:
        """Set the driver's autocommit flag; remember whether we left it on."""
        self.driver.autocommit = value
        self.autocommit_set = value

    def close(self, dead: bool = False) -> None:
        """Give the connection back to the pool as it came (*dead*: invalidated instead)."""
        if self.closed:
            return
        cursor, self.cursor = self.cursor, None
        try:
            if cursor is not None:
                cursor.close()
            if self.autocommit_set and not dead:
                self.set_autocommit(False)
        except Exception:  # the connection is unusable: never pool it again
            dead = True
        # (one invalidated already, by SQLAlchemy or a stop, is only closed)
        super().close(dead and self.connection.is_valid)


# -- driver-level calls on a SQLAlchemy Connection ----------------------------------------------
def driver_cursor(connection: Connection) -> Any | None:
    """A DBAPI cursor in the connection's transaction, or None to go through SQLAlchemy.

    None while SQLAlchemy's cursor events or SQL echo would see the statements (tracing, SQL
    logging): they fire only through ``exec_driver_sql``.
    """
    if sqlalchemy_internals.statements_observed(connection):
        return None
    if not connection.in_transaction():
        connection.begin()  # what autobegin would do: the caller commits or rolls back
    return connection.connection.cursor()


def driver_rows(connection: Connection, text: str, params: Any) -> list[Any]:
    """Every row of *text* (in the driver's paramstyle) run in *connection*'s transaction.

    On the driver's cursor (SQLAlchemy's statement machinery costs as much as the round
    trip), unless something listens to the statements (:func:`driver_cursor`).
    """
    cursor = driver_cursor(connection)
    if cursor is None:
        return list(connection.exec_driver_sql(text, params))
    try:
        cursor.execute(text, params)
        return cursor.fetchall()  # type: ignore[no-any-return]
    finally:
        cursor.close()


def rollback_on_driver(connection: Connection) -> None:
    """Roll back *connection*'s transaction with the driver's own rollback (no statement).

    The next statement begins a new transaction; SQLAlchemy's transaction object is left as
    it was (the caller ends it, which then has nothing left to undo).
    """
    connection.connection.dbapi_connection.rollback()  # type: ignore[union-attr]


def direct_session(connection: Connection, backend: str) -> bool:
    """Whether *connection*'s session runs on the server process the driver connected to.

    *backend* reads the session's server process (``SELECT pg_backend_pid()``). Behind a
    pooler in transaction mode (PgBouncer) the next transaction may run on another server
    connection; PgBouncer answers the connection with a process id of its own, so the two
    differ there. A pooler that passed the server's own id through would defeat this check.
    """
    driver_info = getattr(connection.connection.dbapi_connection, "info", None)
    pid = getattr(driver_info, "backend_pid", None)
    if pid is None:
        return False
    rows = driver_rows(connection, backend, ())
    return bool(rows) and rows[0][0] == pid


#: libpq's transaction status of a connection outside any transaction (``PQTRANS_IDLE``), as
#: psycopg's ``connection.info.transaction_status`` gives it.
_IDLE = 0
#: Where a DBAPI connection's :class:`SessionLocks` are kept (its pool record's ``info``).
SESSION_LOCKS = "sqlqueue.session_locks"


class SessionLocks:
    """Locks one DBAPI connection holds for its session, given back when it is checked in.

    :param release: the statement giving locks back (in the driver's paramstyle), with
        ``prefix`` and ``held`` (a JSON array of ``[name, slot]``) bound by *params*.
    :param params: the driver's parameters of *release* from its values.
    """

    __slots__ = ("held", "params", "release")

    def __init__(self, release: str, params: Callable[[dict[str, str]], Any]) -> None:
        #: Per prefix of the lock names: name -> the slot held.
        self.held: dict[str, dict[str, int]] = {}
        self.release = release
        self.params = params

    @staticmethod
    def values(prefix: str, held: Collection[tuple[str, int]]) -> dict[str, str]:
        """The release statement's values for the locks *held* (name, slot) after *prefix*."""
        return {"prefix": prefix, "held": json.dumps(list(held))}


def listen_for_session_locks(engine: Engine) -> None:
    """Give back each connection's :class:`SessionLocks` when it returns to *engine*'s pool."""
    if not sa.event.contains(engine, "checkin", give_back_session_locks):
        sa.event.listen(engine, "checkin", give_back_session_locks)


def give_back_session_locks(dbapi_connection: Any, record: Any) -> None:
    """Pool ``checkin`` listener: a connection's session locks end with its checkout.

    First a rollback when the connection is in a transaction still (a reset that failed, a
    connection dropped without being closed): the commit that ends the statement giving the
    locks back must never commit it. Not otherwise: psycopg forgets its prepared statements on
    a rollback. If giving them back fails, the connection is closed instead (the server frees
    them).
    """
    locks = record.info.get(SESSION_LOCKS)
    if not locks or dbapi_connection is None or not any(locks.held.values()):
        return
    try:
        status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", None)
        if status != _IDLE:  # (not known: roll back)
            dbapi_connection.rollback()
        cursor = dbapi_connection.cursor()
        try:
            for prefix, held in locks.held.items():
                if held:
                    values = SessionLocks.values(prefix, held.items())
                    cursor.execute(locks.release, locks.params(values))
        finally:
            cursor.close()
        dbapi_connection.commit()
    except BaseException as error:  # the driver's own, or an interrupt: closing frees them
        log.warning("giving back session locks failed, closing the connection: %s", error)
        record.invalidate(error if isinstance(error, Exception) else None)
        if not isinstance(error, Exception):
            raise
    finally:
        for held in locks.held.values():
            held.clear()
