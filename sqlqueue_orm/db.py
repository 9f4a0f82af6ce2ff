"""Engines, driver-error translation and catalog look-ups, in one place.

:func:`create_engine` sets up each database the way a queue needs it: SQLite in WAL mode with
``BEGIN IMMEDIATE`` transactions (writers queue up on the busy timeout instead of failing with
"database is locked" when a reader upgrades; reads on a connection of :func:`reading` take no
lock) and pyodbc with ``fast_executemany``. A write lock another process holds past SQLite's
busy timeout (``?timeout=SECONDS`` in the URL, 30 s by default) is
:class:`~sqlqueue_orm.exceptions.DatabaseLocked`, naming the file.

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
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, dialects, exceptions

log = logging.getLogger(__name__)

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
    parsed = engine_url(url)
    support = dialects.for_url(parsed.get_backend_name())
    # Every code path here ends its transactions (Connection.close() rolls back an open one),
    # so the pool's reset-on-return ROLLBACK is a second, paid-for safety net per checkout.
    kwargs.setdefault("pool_reset_on_return", None)
    try:
        return support.create_engine(
            parsed, sqlite_synchronous=sqlite_synchronous.upper(), **kwargs
        )
    except ImportError as error:  # SQLAlchemy imports the driver when it makes the engine
        raise exceptions.ConfigurationError(support.missing_driver(parsed, error)) from error


def without_password(url: str) -> str:
    """*url* with its password masked (errors and logs must never show it)."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL at all: nothing in it is known to be a password
        return url if "@" not in url else "<unparseable URL>"


def engine_url(url: str | sa.URL) -> sa.URL:
    """*url* as :func:`create_engine` connects with it.

    ``postgres://`` and ``postgresql://`` (no driver named) are ``postgresql+psycopg://``, the
    driver the ``postgres`` extra installs.

    :raises sqlalchemy.exc.ArgumentError: *url* is not a URL.
    """
    parsed = sa.make_url(url)
    return dialects.for_url(parsed.get_backend_name()).engine_url(parsed)


#: Engines whose current schema was asked for, even if the answer was none.
_SCHEMA_ASKED: weakref.WeakSet[Engine] = weakref.WeakSet()


def current_schema(engine: Engine) -> str | None:
    """The schema names without one resolve to on *engine* (``current_schema()``), or None.

    SQLAlchemy's dialect asks once, on the engine's first connection; before that, one
    connection is opened to ask.

    :raises DatabaseError: the database cannot be reached.
    """
    name = engine.dialect.default_schema_name
    if name is None and engine not in _SCHEMA_ASKED:
        with wrap_db_errors(label="current schema"), engine.connect():
            pass
        _SCHEMA_ASKED.add(engine)
        name = engine.dialect.default_schema_name
    return name


# -- error translation ----------------------------------------------------------------------
# The markers live with each dialect (sqlqueue_orm.dialects); a driver error does not say which
# database raised it, so it is read with all of them.


#: What SQLAlchemy raises when the database fails or no connection can be had: a driver's
#: error it wrapped, or its pool's timeout (every connection checked out past ``pool_timeout``).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (exc.DBAPIError, exc.TimeoutError)


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
    return any(marker in text for marker in dialects.TRANSIENT_MARKERS)


def translate_error(
    error: BaseException,
    queue: str | None = None,
    on_missing_column: Callable[[], None] | None = None,
    *,
    label: str | None = None,
    missing_table: tuple[str, str] | None = None,
) -> exceptions.SqlQueueError:
    """The :class:`SqlQueueError` to raise (``from error``) for a driver error, naming the queue.

    :param label: what failed, for errors of no queue (``"outbox"``): the message's prefix.
    :param missing_table: ``(table, fix)``: a missing *table* (its name in the driver's
        message) is :class:`SchemaOutdated` saying *fix*.
    """
    original = getattr(error, "orig", None) or error
    text = _describe(error)
    where = f"queue {queue!r}: " if queue else f"{label}: " if label else ""
    if isinstance(error, exc.TimeoutError):
        return exceptions.DatabaseError(
            f"{where}no connection of the pool came free in time (every one is in use: a "
            f"larger pool_size, or fewer threads holding one): {original}",
            transient=True,
        )
    missing = any(marker in text for marker in dialects.MISSING_TABLE_MARKERS)
    if queue and missing:
        return exceptions.QueueNotFound(queue)
    if missing_table is not None and missing and missing_table[0].lower() in text:
        return exceptions.SchemaOutdated(*missing_table)
    if any(marker in text for marker in dialects.LOCKED_MARKERS):
        return exceptions.DatabaseLocked(
            getattr(original, "file", None), getattr(original, "waited", None), where
        )
    if on_missing_column is not None and any(
        marker in text for marker in dialects.MISSING_COLUMN_MARKERS
    ):
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
    *,
    label: str | None = None,
    missing_table: tuple[str, str] | None = None,
) -> Iterator[None]:
    """Translate driver errors into :class:`SqlQueueError` children, naming the queue.

    The one error translator of the package (see :func:`translate_error` for the arguments).

    :param dbapi_error: the driver's own ``Error`` class, for code that runs statements on a
        DBAPI cursor directly (SQLAlchemy's wrappers are always translated).
    """
    caught: tuple[type[BaseException], ...] = DRIVER_ERRORS
    if dbapi_error is not None:
        caught += (dbapi_error,)
    try:
        yield
    except caught as error:
        raise translate_error(
            error, queue, on_missing_column, label=label, missing_table=missing_table
        ) from error


@contextlib.contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A connection of *engine* whose transactions only read, for a ``with`` block.

    On SQLite they begin without the write lock (``BEGIN``, not ``BEGIN IMMEDIATE``), so a
    peek, a browse or an inspection runs while another process writes; elsewhere it is a plain
    connection. A write on it may fail at once with "database is locked" instead of waiting:
    write on a connection of ``engine.begin()``.
    """
    try:
        connection = engine.connect()
    except DRIVER_ERRORS as error:  # no connection to be had: the package's error, as all
        raise translate_error(error) from error
    with connection:
        connection.execution_options(**{dialects.READS_ONLY: True})
        yield connection


def driver_cause(error: BaseException) -> str:
    """The driver's own message for *error*, first line only, for a one-line error.

    Drivers add hints on further lines (psycopg: "Is the server running on that host...").
    """
    lines = str(getattr(error, "orig", None) or error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__


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
