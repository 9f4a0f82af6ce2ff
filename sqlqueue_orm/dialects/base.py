"""What every dialect provides: :class:`DialectSupport`, one frozen instance per database.

The fields are facts (limits, hints, statements, error markers); the methods are the few things
a dialect does differently with them (take the install lock, delete in batches, make an engine).
Code outside :mod:`sqlqueue_orm.dialects` asks ``dialects.for_dialect(engine).field`` instead of
branching on ``dialect.name``; what a dialect cannot do is ``None`` there. Related statements
come in small frozen groups: :class:`SqlText` (the hot path: send, receive, peek, purge),
:class:`NotifyWakeup` (``LISTEN``/``NOTIFY``), :class:`SessionLock` and :class:`StreamFence`
(the Spark stream's single reader and its offsets); the groups of the services built on the
queues have modules of their own: :mod:`~sqlqueue_orm.dialects.flow` (the flow-control claims
and rate reservations) and :mod:`~sqlqueue_orm.dialects.control` (the upserts of live
control). Where dialects differ in kind rather than in text, the field is a value naming the
behaviour (:class:`QueueLayout`, :class:`AddressForm`, :class:`FenceKind`), never a dialect's
name.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from sqlqueue_orm import sqlalchemy_internals
from sqlqueue_orm.dialects.control import CONTROL_UPSERTS, ControlStatements
from sqlqueue_orm.dialects.flow import FlowStatements

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


class FenceKind(enum.Enum):
    """How a stream reader finds the offset at or below which every row has committed."""

    #: Writers commit one at a time, in order: the highest committed value is the fence.
    HIGHEST = "highest"
    #: A range scan under shared locks (:attr:`StreamFence.scan_hint`) waits for rows still
    #: being inserted above the start.
    LOCKING_SCAN = "locking_scan"
    #: A value seen becomes the fence once every transaction in flight when it was seen has
    #: ended (:attr:`StreamFence.snapshot`, :attr:`StreamFence.in_progress`).
    SNAPSHOT = "snapshot"


@dataclasses.dataclass(frozen=True)
class SqlText:
    """The hot path's statements on one dialect. ``None``: the dialect has no such variant.

    Templates use ``{table}`` for the queue table and ``:name`` for parameters;
    :func:`sqlqueue_orm.queuing.sql.render` renders them once per queue.
    """

    send: str
    send_without_recoverable: str
    receive: str
    peek: str
    purge_expired: str
    purge_all: str
    #: Receive and purge for a role without UPDATE privilege (PostgreSQL): skips rows other
    #: receivers hold with transaction-scoped advisory locks instead of FOR UPDATE SKIP LOCKED.
    receive_without_row_locks: str | None = None
    purge_expired_without_row_locks: str | None = None
    #: Whether this role may lock the queue's rows (``:t``: the quoted table, as a value); asked
    #: once per queue where the statements above exist.
    update_privilege: str | None = None
    #: Columns the statements need; a table without them is reported as outdated, not retried.
    required_columns: tuple[str, ...] = ()
    #: Whether send skips a row whose id is already queued (its row count then says so).
    send_skips_duplicates: bool = False
    #: How native ids go to and come back from the driver.
    id_to_driver: Callable[[uuid.UUID], Any] = str
    #: The stored value of a column (``"Id"``, ``"Body"``, ``"Expires"``) from what a receive or
    #: a browse returned for it where it could not be read the fast way (for the receive's
    #: expired column, a value neither 0 nor 1): :mod:`sqlqueue_orm.queuing.rows`.
    stored_value: Callable[[str, Any], object] = lambda column, value: value
    #: How the receive's Headers column is encoded when it comes back as bytes.
    headers_encoding: str = "utf-8"
    #: How a plain SELECT reads the Headers column (``{headers}``: its quoted name) so that
    #: the driver cannot fail decoding it, as the receive reads it.
    headers_read: str = "{headers}"
    #: How a plain SELECT reads Id, Body and Expires (``{id}``, ``{body}``, ``{expires}``) so
    #: that the driver cannot fail on a value not of the column's type, as the receive reads
    #: them (see :attr:`stored_value`).
    id_read: str = "{id}"
    body_read: str = "{body}"
    #: The receive's expired column as a plain SELECT reads it (``{expires}``: the quoted
    #: Expires): whether the message expired, computed by the database as the receive does
    #: (the driver never converts a date it may not hold, PostgreSQL's ``infinity``).
    expired_read: str = (
        "CASE WHEN {expires} IS NULL THEN 0 WHEN {expires} > CURRENT_TIMESTAMP THEN 0 ELSE 1 END"
    )
    #: How one statement of the transport's own runs without BEGIN/COMMIT around it (see
    #: :class:`sqlqueue_orm.connections.OwnStatement`): ``"driver"`` sets the DBAPI
    #: connection's ``autocommit`` flag (psycopg, pyodbc); ``"implicit"``: the driver already
    #: commits each statement by itself (sqlite3 with ``isolation_level=None``).
    autocommit: str = "driver"
    # Max rows one receive may ask for (SQL Server: TOP takes a bigint; keep batches sane).
    max_batch: int = 10_000
    #: Take one row by its native id (``:id``) as the receive takes rows, same columns out:
    #: locked with the receive's hints and skipped if another transaction holds it, so two
    #: operators retrying or deleting one error-queue message cannot both take it.
    receive_by_id: str = ""
    #: The receive, its advisory-lock variant and the peek scanning the queue from a lower
    #: bound of the row version (``:floor``, 0 for the whole queue), so that the dead index
    #: entries a long-held snapshot keeps below the head are skipped
    #: (:mod:`sqlqueue_orm.queuing.floor`). None: the dialect has no such dead prefix.
    receive_from_floor: str | None = None
    receive_without_row_locks_from_floor: str | None = None
    peek_from_floor: str | None = None


def _squeezed(text: str) -> str:
    """*text* without white space, in lower case (catalog text compared with ours)."""
    return "".join(text.split()).lower()


@dataclasses.dataclass(frozen=True, kw_only=True)
class NotifyWakeup:
    """Idle receivers woken by ``LISTEN``/``NOTIFY`` (:mod:`sqlqueue_orm.receiving.wakeup`).

    A statement-level trigger on each queue table notifies :attr:`channel` with the table's
    name; ``{table}`` is the queue table, quoted by SQLAlchemy's identifier preparer.
    """

    #: The channel every queue table's trigger notifies; the payload is the table's name.
    channel: str
    #: The trigger's name on every queue table, and the function it calls.
    trigger: str
    function: str
    #: The call the trigger function makes (``sqlqueue verify`` looks for it in the function).
    notify_call: str
    #: Creates (or replaces) the trigger function.
    create_function: str
    #: Serializes installers of the function (``:key``: the function's name).
    install_lock: str
    drop_trigger: str
    #: ``{table}`` and ``{when}``: the slots' checks (:meth:`trigger_statement`).
    create_trigger: str
    #: The trigger's test of one slot, ``{slot}`` and ``{table_key}`` integer literals: false
    #: when a waiter holds it; joined with :attr:`slot_join` for every slot.
    slot_check: str
    slot_join: str
    #: Registers a waiter on one slot (true: registered), one expression per slot tried in
    #: turn; :attr:`unregister` releases it.
    register: str
    unregister: str
    #: The first slot's key; the slots are ``slot_namespace + 0 .. slots - 1``.
    slot_namespace: int
    slots: int
    #: Run on the listener's own connection, in autocommit.
    listen: str
    #: The trigger ``:trigger`` on ``:table`` (quoted): its definition and its function's source.
    trigger_catalog: str
    #: The schema and name of the table ``:table`` (quoted) as the catalog spells them.
    table_identity: str
    #: The server process of this session (a pooler in transaction mode changes it).
    backend_pid: str
    #: In the error of a trigger the role may not create (it does not own the table).
    cannot_create_markers: tuple[str, ...]

    @staticmethod
    def table_key(schema: str, name: str) -> int:
        """The queue's second lock key: a stable 31-bit hash of *schema*.*name*.

        Computed in Python, not by the server, so the trigger (the key baked in at install)
        and the waiters agree without a catalog lookup per registration; the names are the
        catalog's (:attr:`table_identity`), so two spellings of one address share a key.
        Never negative: the catalog prints a negative literal as a cast, which would not
        compare equal with the statement installed.
        """
        digest = hashlib.blake2b(f"{schema}.{name}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") & 0x7FFF_FFFF

    def trigger_is_current(self, definition: str, source: str, table_key: int) -> bool:
        """Whether a trigger's *definition* and its function's *source* are the current ones."""
        normalised = _squeezed(definition)
        return (
            "AFTER INSERT ON" in definition
            and "FOR EACH STATEMENT" in definition
            and f"{self.function}()" in definition
            and _squeezed(self.notify_call) in _squeezed(source)
            and all(
                _squeezed(self.slot_check.format(slot=slot, table_key=table_key)) in normalised
                for slot in self.slot_keys()
            )
            # no more slots than ours either: each costs every send a lock try
            and normalised.count(_squeezed(self.slot_check.split("(")[0]) + "(") == self.slots
        )

    def slot_keys(self) -> tuple[int, ...]:
        """The first key of each waiter slot."""
        return tuple(self.slot_namespace + slot for slot in range(self.slots))

    def trigger_condition(self, table_key: int) -> str:
        """The trigger's ``WHEN`` test, *table_key* baked in: every slot free of waiters."""
        return self.slot_join.join(
            self.slot_check.format(slot=slot, table_key=int(table_key))
            for slot in self.slot_keys()
        )

    def trigger_statement(self, table: str, table_key: int) -> str:
        """``CREATE TRIGGER`` on *table* (quoted) for the table's key *table_key*."""
        return self.create_trigger.format(table=table, when=self.trigger_condition(table_key))

    def register_statement(self, table_key: int) -> str:
        """One ``SELECT`` trying each slot in turn: the slot's key taken, or NULL for none."""
        tries = " ".join(
            f"WHEN {self.register.format(slot=slot, table_key=int(table_key))} THEN {slot}"
            for slot in self.slot_keys()
        )
        return f"SELECT CASE {tries} END"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionLock:
    """A lock owned by a connection (session), taken without waiting: ``:resource`` bound."""

    acquire: str
    release: str
    #: Whether the scalar :attr:`acquire` returned means the lock was granted.
    granted: Callable[[Any], bool]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamFence:
    """How a Spark stream reader finds its end offset (a RowVersion nothing commits below)."""

    kind: FenceKind
    #: :attr:`FenceKind.LOCKING_SCAN`: the table hint of the range scan.
    scan_hint: str | None = None
    #: :attr:`FenceKind.SNAPSHOT`: the current snapshot, as text.
    snapshot: str | None = None
    #: :attr:`FenceKind.SNAPSHOT`: how many transactions of ``:snapshot`` are still running.
    in_progress: str | None = None


#: Columns that make a table a queue table in NServiceBus's SQL Server layout, whatever its
#: name (Recoverable, CorrelationId and ReplyToAddress may have been dropped: NServiceBus 7+
#: tolerates that). SQLite tables have this layout too.
SQLSERVER_SIGNATURE = ("Id", "Expires", "Headers", "Body", "RowVersion")

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
