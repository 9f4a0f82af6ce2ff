"""SQLite: the embedded default; ``BEGIN IMMEDIATE`` serializes writers, so no locks or hints.

The write lock is the whole database's. A statement that needs it while another connection
holds it waits (the busy timeout: :data:`BUSY_TIMEOUT_S`, or ``?timeout=SECONDS`` in the URL),
says so after :data:`PATIENCE_S` (a warning naming the file), and then fails with a driver
error that names the file (:class:`WriteLockTimeout`, translated by
:func:`sqlqueue_orm.db.translate_error` into :class:`~sqlqueue_orm.exceptions.DatabaseLocked`).
A transaction that only reads (a connection of :func:`sqlqueue_orm.db.reading`) begins with a
plain ``BEGIN``: in WAL mode it needs no lock and waits for nobody.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import characteristics

from sqlqueue_orm import exceptions
from sqlqueue_orm.dialects import base, control, statements

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect, Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

#: Seconds a writer waits for the write lock before "database is locked" (the default of
#: ``?timeout=`` in the URL).
BUSY_TIMEOUT_S = 30.0
#: Seconds of waiting for the write lock before a warning says whose lock is waited for.
PATIENCE_S = 1.0
#: Every transaction that may write takes the write lock up front: writers queue up on the
#: busy timeout instead of failing at once with "database is locked" when a reader upgrades
#: (a deferred transaction that read first cannot wait for a writer that committed since).
BEGIN = "BEGIN IMMEDIATE"
#: A transaction that only reads (:data:`base.READS_ONLY`): no lock, in WAL mode no wait.
BEGIN_READ = "BEGIN"
_LOCKED = "database is locked"

_T = TypeVar("_T")


class WriteLockTimeout(sqlite3.OperationalError):
    """The busy timeout ran out while another connection held the write lock of :attr:`file`."""

    def __init__(self, file: str, waited: float) -> None:
        #: The database file.
        self.file = file
        #: Seconds waited.
        self.waited = waited
        super().__init__(
            f"{_LOCKED}: another connection held the write lock of {file} for {waited:g} s"
        )


class WaitingConnection(sqlite3.Connection):
    """sqlite3's connection whose statements wait for the write lock in two steps.

    The busy timeout is :data:`PATIENCE_S` first; a statement that could not get the lock
    within it logs a warning naming the file, waits the rest of :attr:`timeout`, and then
    raises :class:`WriteLockTimeout`. A statement refused "database is locked" did nothing,
    so running it again is safe. Set up by :meth:`SqliteSupport.create_engine`.
    """

    #: The database file, for the warning and the error.
    file = ""
    #: The whole busy timeout, in seconds.
    timeout = BUSY_TIMEOUT_S
    #: Whether the file is in WAL mode (set on connect): readers wait for no writer.
    wal = False
    #: What its transactions begin with: :data:`BEGIN`, or :data:`BEGIN_READ` while a
    #: Connection marked :data:`base.READS_ONLY` uses it (see ``_ReadsOnly``).
    begin_statement = BEGIN

    def cursor(self, factory: Any = None) -> Any:
        """A :class:`WaitingCursor` outside a transaction, the driver's own inside (or *factory*).

        Only a statement that takes the write lock itself can wait for it: ``BEGIN IMMEDIATE``,
        or a write in autocommit, both run outside a transaction. Inside one, ``BEGIN
        IMMEDIATE`` holds the lock already, and a read-only ``BEGIN`` never wants it; in WAL
        mode (:attr:`wal`) nothing else in a transaction waits, so its statements are spared
        the wrapper's call on every execute. A cursor made outside a transaction keeps
        waiting in the transactions it then begins (the Transport's kept cursor begins its
        own). Without WAL (in memory, or a file that could not switch) every cursor waits.
        """
        if factory is None:
            factory = sqlite3.Cursor if self.in_transaction and self.wal else WaitingCursor
        return _CURSOR(self, factory)

    def waited(self, error: sqlite3.OperationalError, again: Callable[[], _T]) -> _T:
        """Run *again* after *error* if it is the write lock: wait the rest, say so first."""
        if type(error) is not sqlite3.OperationalError or str(error) != _LOCKED:
            raise error
        patience = min(PATIENCE_S, self.timeout)
        rest = self.timeout - patience
        if rest <= 0:
            raise WriteLockTimeout(self.file, self.timeout) from error
        log.warning(
            "waiting up to %g s more for the write lock of SQLite file %s: another process "
            "(or another connection of this one) holds it",
            rest, self.file,
        )
        self.set_busy_timeout(rest)
        try:
            return again()
        except sqlite3.OperationalError as second:
            if type(second) is sqlite3.OperationalError and str(second) == _LOCKED:
                raise WriteLockTimeout(self.file, self.timeout) from second
            raise
        finally:
            self.set_busy_timeout(patience)

    def set_busy_timeout(self, seconds: float) -> None:
        """``PRAGMA busy_timeout`` in seconds."""
        sqlite3.Connection.execute(self, f"PRAGMA busy_timeout={int(seconds * 1000)}")


class WaitingCursor(sqlite3.Cursor):
    """The cursor of a :class:`WaitingConnection`: its ``execute`` waits for the write lock.

    ``executemany`` is left as it is: it runs inside a transaction of ours, which has taken the
    lock with ``BEGIN IMMEDIATE`` already (in autocommit it would not be all or none).
    """

    def execute(self, sql: str, parameters: Any = (), /) -> WaitingCursor:
        """``sqlite3.Cursor.execute``, waiting for the write lock as the connection says."""
        try:
            return _EXECUTE(self, sql, parameters)  # not super(): a call less on every execute
        except sqlite3.OperationalError as error:
            connection = self.connection
            if not isinstance(connection, WaitingConnection):
                raise
            return connection.waited(error, lambda: _EXECUTE(self, sql, parameters))


_CURSOR = sqlite3.Connection.cursor
_EXECUTE = sqlite3.Cursor.execute


# SQLite writes Expires as UTC text 'YYYY-MM-DD HH:MM:SS.SSS', which sorts as it compares.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
# A value the sqlite3 driver could fail to fetch (text that is not UTF-8 fails the whole
# fetch, and the batch with it) or that is not of its column's type comes back so that it
# cannot fail: the Id's text as a blob (its bytes), and any other value as
# '<typeof>:<hex of its bytes>' (see stored_value): an Id that is not text, a Body that is
# text, an Expires that is not a date. A good row's Body and Expires come back as stored.
_MARKED = "typeof({column}) || ':' || hex({column})"
#: How a receive or a browse reads Id and Body ({id}, {body}: their quoted names).
ID_READ = (
    "CASE typeof({id}) WHEN 'text' THEN CAST({id} AS BLOB) ELSE "
    + _MARKED.format(column="{id}") + " END"
)
BODY_READ = (
    "CASE WHEN typeof({body}) = 'text' THEN " + _MARKED.format(column="{body}")
    + " ELSE {body} END"
)
# An Expires SQLite can read as a date: text julianday() reads. Any other stored value (a number,
# a blob, '' or other text) never counts as expired: the receive returns it marked, and the row
# comes out as a poison message. typeof(), not IS NULL: in a DELETE's RETURNING, SQLite answers
# "Expires" IS NULL with false for a NULL that the partial index on Expires (WHERE "Expires" IS
# NOT NULL) leaves out.
_DATE = "(typeof(\"Expires\") = 'text' AND julianday(\"Expires\") IS NOT NULL)"
#: The receive's expired column: 0 or 1, or the marked Expires when it is not a date.
EXPIRED_READ = (
    "CASE WHEN typeof({expires}) = 'null' THEN 0 "
    "WHEN typeof({expires}) = 'text' AND julianday({expires}) IS NOT NULL "
    f"THEN {{expires}} <= {_NOW} "
    "ELSE " + _MARKED.format(column="{expires}") + " END"
)
_RETURNED = (
    ID_READ.format(id='"Id"') + ', "RowVersion", ' + EXPIRED_READ.format(expires='"Expires"')
    + ', CAST("Headers" AS BLOB), ' + BODY_READ.format(body='"Body"')
)
_EXPIRES = (
    "CASE WHEN :ttbr IS NULL THEN NULL "
    "ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (:ttbr / 1000.0) || ' seconds') END"
)


def stored_value(column: str, returned: object) -> object:
    """What is stored in *column*, from what a receive or a browse *returned* for it.

    ``'<typeof>:<hex>'`` is made back into the value; the Id's bytes into its text; any other
    value is as it is. Text that is not UTF-8 comes back as its bytes.
    """
    if type(returned) is bytes and column == "Id":
        try:
            return returned.decode("utf-8")
        except UnicodeDecodeError:
            return returned
    if type(returned) is not str:
        return returned
    kind, colon, digits = returned.partition(":")
    if not colon or kind not in ("text", "blob", "integer", "real", "null"):
        return returned
    if kind == "null":
        return None
    data = bytes.fromhex(digits)
    if kind == "blob":
        return data
    if kind == "text":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data
    return int(data) if kind == "integer" else float(data)


#: The hot path: send, receive, peek, purge.
HOT_PATH = statements.SqlText(
    headers_read="CAST({headers} AS BLOB)",
    id_read=ID_READ,
    body_read=BODY_READ,
    expired_read=EXPIRED_READ,
    send=(
        'INSERT INTO {table} ("Id", "Recoverable", "Expires", "Headers", "Body") '
        f"VALUES (:id, 1, {_EXPIRES}, :headers, :body)"
    ),
    send_without_recoverable=(
        'INSERT INTO {table} ("Id", "Expires", "Headers", "Body") '
        f"VALUES (:id, {_EXPIRES}, :headers, :body)"
    ),
    # SQLite serializes writers, so the oldest rows are never held by another receiver.
    # Headers come back as a BLOB and are decoded in Python: SQLite stores whatever bytes it is
    # given in a TEXT column, and the sqlite3 driver fails the whole fetch ("Could not decode to
    # UTF-8 column") on a value that is not UTF-8, which would block the queue behind that row.
    receive=(
        'DELETE FROM {table} WHERE "RowVersion" IN ('
        'SELECT "RowVersion" FROM {table} ORDER BY "RowVersion" LIMIT :n) '
        f"RETURNING {_RETURNED}"
    ),
    # Two sub-selects: SQLite answers a lone MIN or MAX of the rowid from the b-tree's ends, but
    # scans the whole table for MAX(x) - MIN(x) in one select (a cost that grows with the queue).
    peek=(
        'SELECT COALESCE((SELECT MAX("RowVersion") FROM {table}) '
        '- (SELECT MIN("RowVersion") FROM {table}) + 1, 0)'
    ),
    purge_expired=(
        'DELETE FROM {table} WHERE "RowVersion" IN ('
        f'SELECT "RowVersion" FROM {{table}} WHERE "Expires" < {_NOW} AND {_DATE} '
        'ORDER BY "RowVersion" LIMIT :n)'
    ),
    purge_all="DELETE FROM {table}",
    # One writer at a time: nobody else holds the row.
    receive_by_id=(
        'DELETE FROM {table} WHERE "Id" = :id '
        f"RETURNING {_RETURNED}"
    ),
    id_to_driver=lambda value: value.hex,
    stored_value=stored_value,
    # One write statement takes the write lock as it starts, as BEGIN IMMEDIATE would.
    autocommit="implicit",
)

#: A Spark stream's end offset: one writer at a time, so rows commit in RowVersion order and the
#: highest committed RowVersion is a fence.
STREAM_FENCE = statements.StreamFence(kind=statements.FenceKind.HIGHEST)

# Delayed delivery: Due is UTC text 'YYYY-MM-DD HH:MM:SS.SSS' (as Expires), which sorts as it
# compares. SQLite has no INSERT from a DELETE, so the move is two statements in the caller's
# transaction, which holds the only write lock: both pick the same rows, those due before one
# ``:now`` (this process's clock is the database's), in (Due, RowVersion) order.
_SQLITE_MATURED = (
    'SELECT "RowVersion" FROM {table} WHERE "Due" < :now '
    'ORDER BY "Due", "RowVersion" LIMIT :n'
)
DELAYED_STORE = (
    'INSERT INTO {table} ("Headers", "Body", "Due") VALUES (:headers, :body, '
    "strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (:due_ms / 1000.0) || ' seconds'))"
)
DELAYED_MOVE = (
    'INSERT INTO {queue} ("Id", "Recoverable", "Expires", "Headers", "Body") '
    'SELECT lower(hex(randomblob(16))), 1, NULL, "Headers", "Body" FROM {table} '
    f'WHERE "RowVersion" IN ({_SQLITE_MATURED}) ORDER BY "Due", "RowVersion"',
    f'DELETE FROM {{table}} WHERE "RowVersion" IN ({_SQLITE_MATURED})',
)
DELAYED_NEXT_DUE = (
    """SELECT (julianday("Due") - julianday('now')) * 86400.0 FROM {table} """
    'ORDER BY "Due" LIMIT 1'
)

#: Indexes of table ``:name``: their ``CREATE INDEX`` text holds the partial-index predicate.
INDEX_CATALOG = (
    "SELECT name, sql, 0, NULL FROM sqlite_master WHERE type = 'index' AND tbl_name = :name"
)


def _in_memory(url: sa.URL) -> bool:
    """Whether *url* names an in-memory database (no file), its connection's own."""
    return url.database in (None, "", ":memory:")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SqliteSupport(base.DialectSupport):
    """SQLite: WAL mode and ``BEGIN IMMEDIATE`` set up on every engine."""

    def create_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> Engine:
        """An engine in WAL mode whose transactions begin with :data:`BEGIN`.

        Its connections are :class:`WaitingConnection`: a statement waits for the write lock
        up to the busy timeout (``?timeout=SECONDS`` in the URL, else :data:`BUSY_TIMEOUT_S`),
        saying so after :data:`PATIENCE_S`. A connection marked :data:`base.READS_ONLY`
        begins with :data:`BEGIN_READ` instead.

        :param sqlite_synchronous: ``PRAGMA synchronous`` for file databases (checked by
            :func:`sqlqueue_orm.db.create_engine`: one of four words).
        """
        connect_args = kwargs.setdefault("connect_args", {})
        given: Any = url.query.get("timeout") or connect_args.get("timeout") or BUSY_TIMEOUT_S
        timeout = float(given[-1] if isinstance(given, tuple) else given)
        connect_args["timeout"] = min(PATIENCE_S, timeout)
        connect_args.setdefault("factory", WaitingConnection)
        connect_args.setdefault("check_same_thread", False)
        # Turn off pysqlite's own transaction handling: we emit BEGIN ourselves (below), which
        # also makes DDL transactional and SAVEPOINT work (SQLAlchemy's documented recipe).
        connect_args["isolation_level"] = None
        url = url.difference_update_query(["timeout"])
        engine = sa.create_engine(url, **kwargs)
        _setup(engine, _in_memory(url), sqlite_synchronous, url.database or ":memory:", timeout)
        return engine

    def create_async_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> AsyncEngine:
        """An aiosqlite engine set up as :meth:`create_engine`'s: WAL, :data:`BEGIN`.

        The busy timeout is SQLite's own (``PRAGMA busy_timeout``, the URL's ``?timeout=``):
        no warning after :data:`PATIENCE_S`, and reads take the write lock too.
        """
        from sqlalchemy.ext.asyncio import create_async_engine

        connect_args = kwargs.setdefault("connect_args", {})
        given: Any = url.query.get("timeout") or connect_args.get("timeout") or BUSY_TIMEOUT_S
        timeout = float(given[-1] if isinstance(given, tuple) else given)
        connect_args["timeout"] = timeout
        connect_args["isolation_level"] = None  # BEGIN is ours, as in create_engine
        url = url.difference_update_query(["timeout"])
        engine = create_async_engine(url, **kwargs)
        _setup(engine.sync_engine, _in_memory(url), sqlite_synchronous, url.database or ":memory:",
               timeout, patience=timeout)  # no WaitingConnection: SQLite waits the whole time
        dialect: Any = engine.sync_engine.dialect
        dialect.do_begin = _do_begin_on_cursor
        return engine

    def sync_engine_url(self, url: sa.URL) -> sa.URL:
        """*url* for pysqlite; refused for an in-memory database (:meth:`require_shared`)."""
        self.require_shared(url)
        return super().sync_engine_url(url)

    def require_shared(self, url: sa.URL) -> None:
        """Refuse an in-memory database, its connection's own.

        A second connection opened from the same URL gets a new, empty one, whose writes nobody
        reads (a refusal, not that).
        """
        if _in_memory(url):
            named = urllib.parse.unquote(url.render_as_string())  # ":memory:", not "%3Amemory%3A"
            raise exceptions.ConfigurationError(
                f"{named!r} is an in-memory SQLite database, which only its "
                "own connection sees: a second connection cannot reach it (use a file database)"
            )

    def reserved_name(self, table: str, schema: str | None) -> str | None:
        """SQLite keeps every table whose name begins with ``sqlite_`` (any case) for itself."""
        if table.lower().startswith("sqlite_"):
            return "SQLite reserves table names beginning with sqlite_"
        return None

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """SQLite's dialect (*target_version* is for SQL Server only)."""
        # Imported on first use: a process on another database never needs it.
        from sqlalchemy.dialects import sqlite

        return sqlite.dialect(paramstyle="named")


def _setup(
    engine: Engine,
    in_memory: bool,
    synchronous: str,
    file: str,
    timeout: float,
    patience: float = PATIENCE_S,
) -> None:
    """Set *engine*'s connections up; SQLite's own busy timeout waits *patience* at most.

    A :class:`WaitingConnection` waits the rest of *timeout* itself.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        if isinstance(dbapi_connection, WaitingConnection):
            dbapi_connection.file = file
            dbapi_connection.timeout = timeout
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(min(patience, timeout) * 1000)}")
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
                wal = str(cursor.fetchone()[0]).lower() == "wal"
                if isinstance(dbapi_connection, WaitingConnection):
                    dbapi_connection.wal = wal
                cursor.execute(f"PRAGMA synchronous={synchronous}")  # one of four words
        finally:
            cursor.close()

    # The transactions' BEGIN is the dialect's (SQLAlchemy calls do_begin where it would fire
    # a "begin" event): an engine-level listener would make every Connection of the engine pay
    # for SQLAlchemy's event dispatch (its creation, begin and commit), the bulk of what
    # engine.begin() costs beyond the driver's BEGIN and COMMIT.
    dialect: Any = engine.dialect
    dialect.do_begin = _do_begin
    dialect.connection_characteristics = dialect.connection_characteristics.union(
        {base.READS_ONLY: _ReadsOnly()}
    )


def _do_begin(fairy: Any) -> None:
    """Begin a transaction: :data:`BEGIN`, or :data:`BEGIN_READ` on a reading connection."""
    driver = fairy.driver_connection
    begin = getattr(driver, "begin_statement", BEGIN)
    try:
        driver.execute(begin)
    except sqlite3.OperationalError as error:  # SQLAlchemy wraps what do_begin raises
        if not isinstance(driver, WaitingConnection):
            raise
        driver.waited(error, lambda: sqlite3.Connection.execute(driver, begin))


def _do_begin_on_cursor(fairy: Any) -> None:
    """Begin a transaction with :data:`BEGIN` on a cursor (an asyncio driver's adapter)."""
    cursor = fairy.cursor()
    try:
        cursor.execute(BEGIN)
    finally:
        cursor.close()


class _ReadsOnly(characteristics.ConnectionCharacteristic):
    """:data:`base.READS_ONLY` as an execution option of a Connection (``db.reading``).

    Set, the driver connection's transactions begin with :data:`BEGIN_READ`; SQLAlchemy
    resets it (:data:`BEGIN` again) when the connection goes back to the pool. Only a
    :class:`WaitingConnection` carries the setting: another connection class keeps
    :data:`BEGIN`, which waits for the lock instead of refusing a write; so does a driver
    connection SQLAlchemy puts under the Connection after an invalidation (the setting was
    the one before it).
    """

    __slots__ = ()

    def reset_characteristic(self, dialect: Dialect, dbapi_conn: Any) -> None:
        """Back to :data:`BEGIN` (the connection goes back to the pool)."""
        if isinstance(dbapi_conn, WaitingConnection):
            dbapi_conn.begin_statement = BEGIN

    def set_characteristic(self, dialect: Dialect, dbapi_conn: Any, value: Any) -> None:
        """:data:`BEGIN_READ` when *value* is true, else :data:`BEGIN`."""
        if isinstance(dbapi_conn, WaitingConnection):
            dbapi_conn.begin_statement = BEGIN_READ if value else BEGIN

    def get_characteristic(self, dialect: Dialect, dbapi_conn: Any) -> Any:
        """Whether the connection's transactions begin without the write lock."""
        return getattr(dbapi_conn, "begin_statement", BEGIN) == BEGIN_READ


# Every field stated by name, in the same shape as the other dialect modules' SUPPORT and
# base.GENERIC, on purpose: each database states its own tables, statements and errors, so
# none takes another's value by omission (tests/unit/test_every_dialect_states_its_layout.py).
SUPPORT = SqliteSupport(
    hot_path=HOT_PATH,
    body_contains="instr({body}, :needle) > 0",
    stream_fence=STREAM_FENCE,
    delayed_store=DELAYED_STORE,
    delayed_move=DELAYED_MOVE,
    delayed_next_due=DELAYED_NEXT_DUE,
    delayed_move_takes_now=True,
    name="sqlite",
    index_catalog=INDEX_CATALOG,
    alter_column="rebuild",
    identifier_limit=1024,
    begin=BEGIN,
    embedded=True,
    peek_counts_held_rows=True,
    single_writer=True,
    # changes when another connection commits; reads no table
    commit_counter="PRAGMA data_version",
    missing_table_markers=("no such table",),
    missing_column_markers=("no such column", "has no column named"),
    transient_markers=(*base.GENERIC_TRANSIENT, _LOCKED),
    locked_markers=(_LOCKED,),
    enforces_text_length=False,
    # The main database file's schema and the temporary one's (attached files have theirs).
    system_schemas=frozenset({"main", "temp"}),
    integer_key_never_null=True,
    flow=None,  # no locks shared between processes: flow control holds within one
    async_driver="aiosqlite",
    identifier_unit="characters",
    address_form=base.AddressForm.BRACKETED,
    queue_layout=base.QueueLayout.ROW_VERSION,
    queue_signature=base.SQLSERVER_SIGNATURE,
    body_string_column="BodyString",
    body_string_ddl=base.BODY_STRING_GENERATED,
    script_separator=";\n",
    delayed_signature=base.DELAYED_SIGNATURE,
    subscription_columns=base.SUBSCRIPTION_COLUMNS,
    subscribe=base.SUBSCRIBE_UPSERT,
    unsubscribe=base.UNSUBSCRIBE,
    subscribers=base.SUBSCRIBERS,
    control=control.CONTROL_UPSERTS,
)
