"""What every dialect provides: :class:`DialectSupport`, one frozen instance per database.

The fields are facts (limits, hints, statements, error markers); the methods are the few things
a dialect does differently with them (take the install lock, delete in batches, make an engine).
Code outside :mod:`sqlqueue_orm.dialects` asks ``dialects.for_dialect(engine).field`` instead of
branching on ``dialect.name``; what a dialect cannot do is ``None`` there. Related statements
come in small frozen groups, in :mod:`~sqlqueue_orm.dialects.statements` (the hot path, the
``LISTEN``/``NOTIFY`` wake-up, session locks, the Spark stream's fence); the groups of the
services built on the queues have modules of their own: :mod:`~sqlqueue_orm.dialects.flow`
(the flow-control claims and rate reservations) and :mod:`~sqlqueue_orm.dialects.control` (the
upserts of live control). Where dialects differ in kind rather than in text, the field is a
value naming the behaviour (:class:`QueueLayout`, :class:`AddressForm`, the stream fence's
:class:`~sqlqueue_orm.dialects.statements.FenceKind`), never a dialect's name.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from sqlqueue_orm import sqlalchemy_internals
from sqlqueue_orm.dialects.control import CONTROL_UPSERTS, ControlStatements
from sqlqueue_orm.dialects.flow import FlowStatements
from sqlqueue_orm.dialects.statements import NotifyWakeup, SessionLock, SqlText, StreamFence

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect, Engine
    from sqlalchemy.ext.asyncio import AsyncEngine


class QualifiedName(Protocol):
    """A table's catalog, schema and name (a ``QueueAddress``; ``str()`` is its address)."""

    @property
    def table(self) -> str:
        """The table's name."""

    @property
    def schema(self) -> str | None:
        """Its schema (``None``: the connection's default)."""

    @property
    def catalog(self) -> str | None:
        """Its catalog (``None``: the connection's database)."""


class QueueLayout(enum.Enum):
    """The two queue table layouts of NServiceBus's SQL transports."""

    #: ``"Id"``, ``"CorrelationId"``, ``"ReplyToAddress"``, ``"Recoverable"``, ``"Expires"``,
    #: ``"Headers"``, ``"Body"``, ``"RowVersion"``: the SQL Server transport's (SQLite too).
    ROW_VERSION = "row_version"
    #: ``id, expires, headers, body, seq``, unquoted lower case: the PostgreSQL transport's.
    SEQ = "seq"


class AddressForm(enum.Enum):
    """How the .NET transport writes a queue address (see :mod:`sqlqueue_orm.addressing`)."""

    #: ``table@[schema]@[catalog]``, parts bracket-delimited.
    BRACKETED = "bracketed"
    #: ``"schema"."table"``, parts double-quoted; no catalog.
    SCHEMA_QUALIFIED = "schema_qualified"


#: Columns that make a table a queue table in NServiceBus's SQL Server layout, whatever its
#: name (Recoverable, CorrelationId and ReplyToAddress may have been dropped: NServiceBus 7+
#: tolerates that). SQLite tables have this layout too.
SQLSERVER_SIGNATURE = ("Id", "Expires", "Headers", "Body", "RowVersion")
#: The same in NServiceBus's PostgreSQL layout (unquoted, so lower case; ``seq`` the order), in
#: table order. Here beside the other layout, not only in the PostgreSQL module, because queue
#: tables name their columns and indexes on any database without loading that module.
POSTGRESQL_SIGNATURE = ("id", "expires", "headers", "body", "seq")

#: PostgreSQL's identifier limit in bytes (NAMEDATALEN - 1); longer names are cut silently. The
#: index names of SQLite's queue tables are made by the same rule, so they keep to it too.
POSTGRESQL_IDENTIFIER_LIMIT = 63

#: The execution option of a connection whose transactions only read (``db.reading``): on a
#: database with one write lock (SQLite) they begin without taking it.
READS_ONLY = "sqlqueue_reads_only"

#: Driver-error text every dialect may show for a transient failure (lower case).
GENERIC_TRANSIENT = (
    "40001",  # serialization failure (SQLSTATE)
    "deadlock",
    "connection",
    "server closed",
    "terminating",
    "timeout expired",
)


#: The subscription table's columns in NServiceBus's SQL Server layout (SQLite has it too).
SUBSCRIPTION_COLUMNS = ("QueueAddress", "Endpoint", "Topic")
#: The columns of NServiceBus's delayed table, in table order (SQL Server's and SQLite's).
DELAYED_SIGNATURE = ("Headers", "Body", "Due", "RowVersion")
#: The optional BodyString column as a generated column (standard SQL; SQLite's form).
BODY_STRING_GENERATED = (
    'ALTER TABLE {table} ADD COLUMN "BodyString" TEXT GENERATED ALWAYS AS '
    '(CAST("Body" AS TEXT)) VIRTUAL'
)
# NServiceBus's statements (SubscribeText, UnsubscribeText, GetSubscribersText of
# src/NServiceBus.Transport.PostgreSql/PostgreSqlConstants.cs, Particular/NServiceBus.SqlServer
# 214c4e8f), with its unquoted column names and :name parameters. SQLite runs the PostgreSQL
# upsert as it is (ON CONFLICT ... DO UPDATE since 3.24; unquoted names ignore case there).
SUBSCRIBE_UPSERT = (
    "INSERT INTO {table} (QueueAddress, Topic, Endpoint) "
    "VALUES (:queue_address, :topic, :endpoint) "
    "ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = :queue_address"
)
UNSUBSCRIBE = "DELETE FROM {table} WHERE Endpoint = :endpoint and Topic = :topic"
SUBSCRIBERS = "SELECT DISTINCT QueueAddress FROM {table} WHERE Topic IN ({topics})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DialectSupport:
    """Everything one database needs at run time outside the hot path, in one frozen place.

    The fields without a default describe the database's tables, statements and errors: every
    dialect states each of them (docs/adding-a-database.md), so none takes another database's
    value by omission. The defaults are features a database may lack (no catalogs, no locks,
    no hints, no wake-up).
    """

    #: SQLAlchemy's ``dialect.name``.
    name: str
    #: The hot path's statements (``None``: a dialect this package does not support).
    hot_path: SqlText | None
    #: Longest identifier (table, schema, catalog name) the database accepts.
    identifier_limit: int
    #: What :attr:`identifier_limit` counts: ``"characters"`` or UTF-8 ``"bytes"``.
    identifier_unit: str
    #: Whether a queue may live in another catalog (database) of the same server.
    cross_catalog: bool = False
    #: Whether a queue's schema is created with its table when missing.
    creates_schemas: bool = False
    #: Statement opening every transaction (``""``: the driver begins implicitly).
    begin: str = ""
    #: Whether the database is a local file (SQLite) rather than a server.
    embedded: bool = False
    #: One write lock for the whole database: while a transaction writes, a second connection
    #: of the same process cannot (SQLite), so modes writing on two connections are refused.
    single_writer: bool = False
    #: How idle receivers are woken by ``LISTEN``/``NOTIFY`` (``None``: they are not).
    notify_wakeup: NotifyWakeup | None = None
    #: A statement whose value changes when another connection commits to the database file,
    #: reading no table (``None``: none): idle receivers watch it for other processes' sends.
    commit_counter: str | None = None
    #: Whether the peek still counts a row whose receive has not committed (PostgreSQL's MVCC
    #: and SQLite's WAL readers do; SQL Server's peek reads past locked rows): the pump then
    #: subtracts the rows its own handlers hold.
    peek_counts_held_rows: bool = False
    #: How the .NET transport of this database writes a queue address.
    address_form: AddressForm
    #: The queue table layout (NServiceBus's two).
    queue_layout: QueueLayout
    #: The columns that make a table a queue table in :attr:`queue_layout`, in table order.
    queue_signature: tuple[str, ...]
    #: Whether index names are per table (SQL Server) rather than one namespace per schema.
    index_names_per_table: bool = False
    #: Whether QueueSettings.sql_server_layout (heap or clustered) applies.
    table_layouts: bool = False
    #: Whether a varchar (non-Unicode) Headers column is worth a warning.
    narrow_text_headers: bool = False
    #: Name of the optional computed BodyString column.
    body_string_column: str
    #: ``ALTER TABLE`` adding that column (``{table}``), the body as text: a cast here.
    body_string_ddl: str
    #: A condition true when the Body column (``{body}``: its quoted name) holds the bytes
    #: ``:needle`` (the error queue's search by body text); ``""``: the dialect cannot.
    body_contains: str = ""
    #: Table hint of every outbox claim (SQLAlchemy drops ``with_for_update()`` on SQL Server).
    claim_hint: str | None = None
    #: Table hint of a read of committed rows only, skipping rows still being written (a Spark
    #: ingest reading its batch) instead of waiting for them.
    committed_read_hint: str | None = None
    #: Transaction-scoped lock serializing queue installers (``:resource`` bound).
    install_lock: str | None = None
    #: Session-scoped lock taken without waiting, and its release (``:resource`` bound):
    #: one Spark ingester per queue. ``None``: none (an :attr:`embedded` database locks a
    #: file beside it instead).
    session_lock: SessionLock | None = None
    #: How a Spark stream reader finds the end of its next batch (``None``: it cannot).
    stream_fence: StreamFence | None = None
    #: Between statements of a DDL script printed for a DBA.
    script_separator: str
    #: Lower-case fragments of driver errors: a missing table, a missing column, a transient
    #: failure (deadlock, serialization, lost connection) on this database.
    missing_table_markers: tuple[str, ...]
    missing_column_markers: tuple[str, ...]
    transient_markers: tuple[str, ...]
    #: Lower-case fragments of a driver error for a write lock another connection held past
    #: the busy timeout (SQLite's whole-database lock).
    locked_markers: tuple[str, ...] = ()
    #: Schemas holding the database's own catalog, never queue tables (lower case), and the
    #: prefixes of more such schemas (``sqlqueue list-queues`` skips them).
    system_schemas: frozenset[str]
    system_schema_prefixes: tuple[str, ...] = ()
    #: Whether a column declared with a length (``CHAR(32)``, ``VARCHAR(255)``) holds text of
    #: any length (SQLite: the declared length is only a name), so two lengths are one type.
    enforces_text_length: bool = True
    #: Whether the table's only primary key column, an INTEGER, can never be NULL whatever its
    #: declaration says (SQLite: it is the rowid).
    integer_key_never_null: bool = False

    # -- native delayed delivery (NServiceBus DelayedMessageTable) --------------------------
    # Templates: ``{table}`` the delayed table, ``{queue}`` the input queue it feeds, both quoted
    # by SQLAlchemy; ``:headers``, ``:body``, ``:due_ms`` (milliseconds from the database's
    # clock), ``:n`` (the batch), ``:now`` (where the dialect reads the clock in Python).
    #: The columns that make a table a delayed table, in table order.
    delayed_signature: tuple[str, ...]
    #: Store one delayed message, due ``:due_ms`` after the database's clock.
    delayed_store: str = ""
    #: Move up to ``:n`` matured messages into ``{queue}``, in the caller's transaction; the
    #: row count of the first statement is the number moved.
    delayed_move: tuple[str, ...] = ()
    #: Seconds from the database's clock to the next due time (no row: no result).
    delayed_next_due: str = ""
    #: Whether :attr:`delayed_move` takes ``:now`` (the database is this process's file).
    delayed_move_takes_now: bool = False

    # -- publish/subscribe (NServiceBus's SubscriptionTable) -------------------------------
    #: Column names of the subscription table: queue address, endpoint, topic (as the .NET
    #: transport of this database creates them; see models/subscription.py).
    subscription_columns: tuple[str, str, str]
    #: Subscribe (an upsert on Endpoint and Topic): ``{table}``, ``:queue_address``,
    #: ``:endpoint``, ``:topic``.
    subscribe: str
    #: Unsubscribe: ``{table}``, ``:endpoint``, ``:topic``.
    unsubscribe: str
    #: The subscribers of some topics: ``{table}``, ``{topics}`` (a list of parameters).
    subscribers: str

    # -- schema verification (sqlqueue_orm.verify) -------------------------------------
    #: The indexes of one table, one row per index and included column: name, partial-index
    #: predicate (or the whole ``CREATE INDEX`` holding it), clustered (0/1), an ``INCLUDE``
    #: column or NULL. ``:table`` is the table quoted by SQLAlchemy, ``:name`` its bare name.
    index_catalog: str = ""
    #: A regular expression matching the casts the catalog writes into the index predicates it
    #: prints (``'...'::timestamp``), removed before they are compared with ours; ``None``:
    #: the catalog prints none.
    catalog_casts: str | None = None
    #: How a column's type or nullability is repaired: ``"alter"`` (each on its own),
    #: ``"restate"`` (one ALTER COLUMN naming type and nullability) or ``"rebuild"`` (the
    #: table is copied into a new one: SQLite cannot alter a column).
    alter_column: str
    #: Storage settings of every queue table (``CREATE TABLE ... WITH``, ``ALTER TABLE ... SET``),
    #: as (name, value) pairs; ``()``: the database's own (see docs/scale.md for the figure).
    queue_storage: tuple[tuple[str, str], ...] = ()
    #: The storage settings a table has, one ``name=value`` a row: ``:table`` quoted.
    storage_catalog: str = ""
    #: Sets storage settings: ``{table}`` quoted by SQLAlchemy, ``{settings}`` ``name=value, ...``.
    storage_ddl: str = ""

    #: Flow control's statements (:class:`~sqlqueue_orm.dialects.flow.FlowStatements`);
    #: ``None``: limits hold per process.
    flow: FlowStatements | None = None
    #: Upserts of the endpoints' control rows
    #: (:class:`~sqlqueue_orm.dialects.control.ControlStatements`).
    control: ControlStatements

    # -- URLs and the driver (sqlqueue_orm.db.create_engine) --------------------------------
    #: Other names of the database in URLs as users paste them (``postgres://``).
    url_schemes: tuple[str, ...] = ()
    #: The driver of a URL that names none (the one :attr:`driver_extra` installs);
    #: ``None``: SQLAlchemy's default.
    driver: str | None = None
    #: The ``sqlqueue_orm`` extra that installs the driver (``pip install
    #: "sqlqueue_orm[<extra>]"``); ``None``: the driver comes with Python.
    driver_extra: str | None = None
    #: The asyncio driver of a URL that names none, for
    #: :func:`sqlqueue_orm.aio.create_async_engine`; ``None``: SQLAlchemy's default.
    async_driver: str | None = None

    # -- bounded waits on the network (docs/endpoint.md, "When the database does not answer") -
    #: Driver connection parameters every connection gets unless its URL or the engine's
    #: ``connect_args`` set them: how long a connection attempt, an idle connection and sent
    #: data unacknowledged may wait on a link that went silent. ``()``: none.
    connect_defaults: tuple[tuple[str, object], ...] = ()
    #: Whether :meth:`statement_waiting` and :meth:`socket_of` can tell (the driver says).
    tells_statement_waiting: bool = False

    @property
    def listen_notify(self) -> bool:
        """Whether idle receivers can be woken by ``LISTEN``/``NOTIFY`` (:attr:`notify_wakeup`)."""
        return self.notify_wakeup is not None

    def creates(self, element: Any) -> bool:
        """Whether DDL element *element* (an index, a constraint) is created on this dialect.

        An element limited with ``ddl_if(dialect=...)`` is created only on the dialects it
        names; any other everywhere.
        """
        allowed = sqlalchemy_internals.ddl_if_dialects(element)
        if allowed is None:
            return True
        return self.name in ((allowed,) if isinstance(allowed, str) else allowed)

    def options_of(self, element: Any) -> Any:
        """The options for this dialect of *element* (an index, a table).

        ``options_of(index)["where"]`` is the index's ``postgresql_where`` on PostgreSQL, its
        ``mssql_where`` on SQL Server.
        """
        return element.dialect_options[self.name]

    def reserved_name(self, table: str, schema: str | None) -> str | None:
        """Why the database keeps table *table* of *schema* for itself, or None if it does not.

        A queue so named would be the database's own catalog: never created, sent to or
        received from. A database this package does not know reserves nothing.
        """
        return None

    def identifier_size(self, value: str) -> int:
        """The size of identifier *value* in :attr:`identifier_unit`."""
        return len(value.encode("utf-8")) if self.identifier_unit == "bytes" else len(value)

    def engine_url(self, url: sa.URL) -> sa.URL:
        """*url* with this dialect's name and, when it names none, its :attr:`driver`.

        ``postgres://`` and ``postgresql://`` become ``postgresql+psycopg://``; a driver the
        URL names is kept.
        """
        return self._with_driver(url, self.driver)

    def _with_driver(self, url: sa.URL, default: str | None) -> sa.URL:
        if not self.name:  # a database this package does not know: SQLAlchemy decides
            return url
        driver = url.get_driver_name() if "+" in url.drivername else default
        drivername = self.name if driver is None else f"{self.name}+{driver}"
        return url if drivername == url.drivername else url.set(drivername=drivername)

    def missing_driver(self, url: sa.URL, error: ImportError) -> str:
        """What to say when the driver of *url* cannot be imported: what is missing, the fix."""
        found = f"the {url.get_backend_name()} driver {url.get_driver_name()} is not installed"
        if self.driver_extra is None:
            return f"{found} ({error})"
        extra = f"sqlqueue_orm[{self.driver_extra}]"
        return f'{found} ({error}); install it with: pip install "{extra}"'

    def create_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> Engine:
        """An engine for *url*, with what this dialect needs for queue work.

        Its connections get :meth:`connect_args`.

        :param sqlite_synchronous: SQLite's ``PRAGMA synchronous`` (other dialects ignore it).
        """
        if self.connect_defaults:
            kwargs["connect_args"] = self.connect_args(url, kwargs.get("connect_args") or {})
        return sa.create_engine(url, **kwargs)

    def connect_args(self, url: sa.URL, given: Mapping[str, Any]) -> dict[str, Any]:
        """*given* (an engine's ``connect_args``) with the :attr:`connect_defaults` left unset.

        A parameter the caller set, in *given* or in *url*'s query, is kept as it is.
        """
        args = dict(given)
        for name, value in self.connect_defaults:
            if name not in args and name not in url.query:
                args[name] = value
        return args

    def statement_waiting(self, dbapi_connection: Any) -> bool:
        """Whether *dbapi_connection* sent a statement whose result has not fully arrived.

        Read from another thread than the one waiting (the endpoint's watchdog,
        :mod:`sqlqueue_orm.receiving.unanswered`); False where the driver cannot tell.
        """
        return False

    def socket_of(self, dbapi_connection: Any) -> int | None:
        """The file descriptor of *dbapi_connection*'s socket (None: not known, or closed)."""
        return None

    def require_shared(self, url: sa.URL) -> None:
        """Raise unless every connection opened from *url* reaches the same database.

        An endpoint's threads and tasks each use connections of their own.

        :raises ConfigurationError: a second connection would not reach the same database.
        """

    def sync_engine_url(self, url: sa.URL) -> sa.URL:
        """*url* of an asyncio engine, for a synchronous engine of the same database.

        The URL's dialect without its driver (:meth:`engine_url` then names :attr:`driver`);
        the query as it is, where both drivers read the same arguments.

        :raises ConfigurationError: a second connection would not reach the same database.
        """
        return url.set(drivername=url.get_backend_name())

    def async_engine_url(self, url: sa.URL) -> sa.URL:
        """*url* with this dialect's name and, when it names none, its :attr:`async_driver`."""
        return self._with_driver(url, self.async_driver)

    def create_async_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> AsyncEngine:
        """An asyncio engine for *url*, with what this dialect needs for queue work.

        :param sqlite_synchronous: SQLite's ``PRAGMA synchronous`` (other dialects ignore it).
        """
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(url, **kwargs)

    def take_install_lock(self, connection: Connection, address: QualifiedName) -> None:
        """Serialize installers of *address* until the transaction ends (if the dialect can)."""
        if self.install_lock is not None:
            connection.execute(
                sa.text(self.install_lock), {"resource": f"sqlqueue_orm:create:{address}"}
            )

    def batched_delete(
        self, table: sa.Table, keys: tuple[str, ...], condition: sa.ColumnElement[bool], text: str
    ) -> sa.Executable:
        """DELETE of up to ``:batch_size`` rows of *table* matching *condition*.

        A LIMITed sub-select of the *keys* (which skips locked rows where the database can);
        *text* is the same condition written in the dialect's SQL, for dialects that need it.
        """
        columns = [table.c[key] for key in keys]
        batch = (
            sa.select(*columns)
            .where(condition)
            .limit(sa.bindparam("batch_size", type_=sa.Integer()))
            .with_for_update(skip_locked=True)
        )
        if len(columns) == 1:
            return sa.delete(table).where(columns[0].in_(batch))
        return sa.delete(table).where(sa.tuple_(*columns).in_(batch))

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """A dialect for printing DDL: named paramstyle, so nothing in a name is %-doubled."""
        raise NotImplementedError(self.name)


#: A database this package does not know: the rules applied before dialects had a home.
# Stated field by field in the same shape as each dialect module's SUPPORT, on purpose: the
# rules of an unknown database are read here, not pieced together from a known one's.
GENERIC = DialectSupport(
    name="",
    hot_path=None,
    identifier_limit=128,
    identifier_unit="characters",
    address_form=AddressForm.BRACKETED,
    queue_layout=QueueLayout.ROW_VERSION,
    queue_signature=SQLSERVER_SIGNATURE,
    body_string_column="BodyString",
    body_string_ddl=BODY_STRING_GENERATED,
    script_separator=";\n",
    missing_table_markers=(),
    missing_column_markers=(),
    transient_markers=GENERIC_TRANSIENT,
    system_schemas=frozenset({"information_schema"}),
    delayed_signature=DELAYED_SIGNATURE,
    subscription_columns=SUBSCRIPTION_COLUMNS,
    subscribe=SUBSCRIBE_UPSERT,
    unsubscribe=UNSUBSCRIBE,
    subscribers=SUBSCRIBERS,
    alter_column="alter",
    control=CONTROL_UPSERTS,
)
