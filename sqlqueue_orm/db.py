"""Engines, driver-error translation and catalog look-ups, in one place.

:func:`create_engine` sets up each database the way a queue needs it: SQLite in WAL mode with
``BEGIN IMMEDIATE`` transactions (writers queue up on the busy timeout instead of failing with
"database is locked" when a reader upgrades), pyodbc with ``fast_executemany``, and pre-ping
everywhere so a dispatcher survives the database going away and coming back.
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


def create_engine(url: str | sa.URL, **kwargs: Any) -> Engine:
    """Create an engine configured for queue work (see the module docstring)."""
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    kwargs.setdefault("pool_pre_ping", True)
    if backend == "sqlite":
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("timeout", _SQLITE_BUSY_TIMEOUT_S)
        connect_args.setdefault("check_same_thread", False)
        # Turn off pysqlite's own transaction handling: we emit BEGIN ourselves (below), which
        # also makes DDL transactional and SAVEPOINT work (SQLAlchemy's documented recipe).
        connect_args["isolation_level"] = None
        engine = sa.create_engine(parsed, **kwargs)
        _setup_sqlite(engine, in_memory=parsed.database in (None, "", ":memory:"))
        return engine
    if backend == "mssql" and parsed.get_driver_name() == "pyodbc":
        kwargs.setdefault("fast_executemany", True)
    return sa.create_engine(parsed, **kwargs)


def _setup_sqlite(engine: Engine, in_memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_S * 1000}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


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


@contextlib.contextmanager
def wrap_db_errors(
    queue: str | None = None, on_missing_column: Callable[[], None] | None = None
) -> Iterator[None]:
    """Translate driver errors into :class:`SqlQueueError` children, naming the queue."""
    try:
        yield
    except exc.DBAPIError as error:
        text = _describe(error)
        where = f"queue {queue!r}: " if queue else ""
        if queue and any(marker in text for marker in _MISSING_TABLE):
            raise exceptions.QueueNotFound(queue) from error
        if on_missing_column is not None and any(marker in text for marker in _MISSING_COLUMN):
            on_missing_column()
            raise exceptions.DatabaseError(
                f"{where}the table's columns changed under us; retry: {error.orig}", transient=True
            ) from error
        raise exceptions.DatabaseError(
            f"{where}{type(error.orig).__name__}: {error.orig}", transient=is_transient(error)
        ) from error


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
