"""Engines, driver-error translation and catalog look-ups, in one place.

:func:`create_engine` sets up each database the way a queue needs it: SQLite in WAL mode with
``BEGIN IMMEDIATE`` transactions (writers queue up on the busy timeout instead of failing with
"database is locked" when a reader upgrades) and pyodbc with ``fast_executemany``.

SQLite durability: ``synchronous=NORMAL`` by default (in WAL mode a commit is not synced to disk
until the next checkpoint), so a power failure or OS crash can lose the last commits; a process
crash loses nothing. ``create_engine(url, sqlite_synchronous="FULL")`` syncs every commit
(``Transport(db.create_engine(url, sqlite_synchronous="FULL"))``), at a cost per commit. No pre-ping
(it costs a round trip per transaction): a connection that died is invalidated by the error it
raises, reported as a transient :class:`DatabaseError`, and the next checkout gets a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, exceptions

log = logging.getLogger(__name__)

#: Default URL of the CLI and the demo: an embedded SQLite file in the working directory.
DEFAULT_URL = "sqlite:///sqlqueue.db"

_SQLITE_BUSY_TIMEOUT_S = 30
_SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def create_engine(
    url: str | sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
) -> Engine:
    """Create an engine configured for queue work (see the module docstring).

    :param sqlite_synchronous: SQLite's ``PRAGMA synchronous`` for file databases: ``NORMAL``
        (default: a power failure can lose the last commits) or ``FULL`` (every commit synced).
    :param kwargs: passed to :func:`sqlalchemy.create_engine`.
    """
    if not isinstance(sqlite_synchronous, str) or (
        sqlite_synchronous.upper() not in _SQLITE_SYNCHRONOUS
    ):
        raise exceptions.ConfigurationError(
            f"sqlite_synchronous {sqlite_synchronous!r} must be one of "
            f"{', '.join(_SQLITE_SYNCHRONOUS)}"
        )
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    # Every code path here ends its transactions (Connection.close() rolls back an open one),
    # so the pool's reset-on-return ROLLBACK is a second, paid-for safety net per checkout.
    kwargs.setdefault("pool_reset_on_return", None)
    if backend == "sqlite":
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("timeout", _SQLITE_BUSY_TIMEOUT_S)
        connect_args.setdefault("check_same_thread", False)
        # Turn off pysqlite's own transaction handling: we emit BEGIN ourselves (below), which
        # also makes DDL transactional and SAVEPOINT work (SQLAlchemy's documented recipe).
        connect_args["isolation_level"] = None
        engine = sa.create_engine(parsed, **kwargs)
        _setup_sqlite(
            engine,
            in_memory=parsed.database in (None, "", ":memory:"),
            synchronous=sqlite_synchronous.upper(),
        )
        return engine
    if backend == "mssql" and parsed.get_driver_name() == "pyodbc":
        kwargs.setdefault("fast_executemany", True)
    return sa.create_engine(parsed, **kwargs)


def _setup_sqlite(engine: Engine, in_memory: bool, synchronous: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute(f"PRAGMA synchronous={synchronous}")  # one of four words
            cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_S * 1000}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Straight to the driver: this runs once per transaction, on the hot path.
        connection.connection.driver_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]


# -- error translation ----------------------------------------------------------------------
_MISSING_TABLE = ("42p01", "invalid object name", "no such table", "undefinedtable")
_MISSING_COLUMN = ("42703", "invalid column name", "no such column", "has no column named")
_TRANSIENT = (
    "40001",  # serialization failure
    "40p01",  # deadlock detected (PostgreSQL)
    "1205",  # deadlock victim (SQL Server)
    "database is locked",
    "deadlock",
    "connection",
    "server closed",
    "terminating",
    "timeout expired",
)


def _describe(error: BaseException) -> str:
    original = getattr(error, "orig", None) or error
    code = getattr(original, "sqlstate", None) or ""
    return f"{code} {original}".lower()


def is_transient(error: BaseException) -> bool:
    """Whether *error* may pass on a retry: deadlock, serialization failure, lost connection."""
    if isinstance(error, exceptions.DatabaseError):
        return error.transient
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, exc.OperationalError | exc.InterfaceError):
        return True
    text = _describe(error)
    return any(marker in text for marker in _TRANSIENT)


def translate_error(
    error: BaseException,
    queue: str | None = None,
    on_missing_column: Callable[[], None] | None = None,
) -> exceptions.SqlQueueError:
    """The :class:`SqlQueueError` to raise (``from error``) for a driver error, naming the queue."""
    original = getattr(error, "orig", None) or error
    text = _describe(error)
    where = f"queue {queue!r}: " if queue else ""
    if queue and any(marker in text for marker in _MISSING_TABLE):
        return exceptions.QueueNotFound(queue)
    if on_missing_column is not None and any(marker in text for marker in _MISSING_COLUMN):
        on_missing_column()
        return exceptions.DatabaseError(
            f"{where}the table's columns changed under us; retry: {original}", transient=True
        )
    return exceptions.DatabaseError(
        f"{where}{type(original).__name__}: {original}", transient=is_transient(error)
    )


@contextlib.contextmanager
def wrap_db_errors(
    queue: str | None = None,
    on_missing_column: Callable[[], None] | None = None,
    dbapi_error: type[BaseException] | None = None,
) -> Iterator[None]:
    """Translate driver errors into :class:`SqlQueueError` children, naming the queue.

    :param dbapi_error: the driver's own ``Error`` class, for code that runs statements on a
        DBAPI cursor directly (SQLAlchemy's wrappers are always translated).
    """
    caught: tuple[type[BaseException], ...] = (exc.DBAPIError,)
    if dbapi_error is not None:
        caught += (dbapi_error,)
    try:
        yield
    except caught as error:
        raise translate_error(error, queue, on_missing_column) from error


# -- catalog look-ups -------------------------------------------------------------------------
def schema_argument(address: addressing.QueueAddress) -> str | None:
    """The ``schema=`` SQLAlchemy takes for *address* (``catalog.schema`` on SQL Server)."""
    if address.catalog is None:
        return address.schema
    for part in (address.catalog, address.schema or "dbo"):
        if any(char in part for char in "[]."):
            raise exceptions.ConfigurationError(
                f"queue {str(address)!r}: catalog and schema names with '[', ']' or '.' can be "
                "sent to and received from, but not created or inspected across catalogs"
            )
    return f"{address.catalog}.{address.schema or 'dbo'}"


def column_names(connection: Connection, address: addressing.QueueAddress) -> set[str]:
    """The column names of the queue table (empty if there is no such table)."""
    inspector = sa.inspect(connection)
    try:
        columns = inspector.get_columns(address.table, schema=schema_argument(address))
    except exc.NoSuchTableError:
        return set()
    return {str(column["name"]) for column in columns}
