"""What every dialect provides: :class:`DialectSupport`, one frozen instance per database.

The fields are facts (limits, hints, statements, error markers); the methods are the few things
a dialect does differently with them (take the install lock, delete in batches, make an engine).
Code outside :mod:`sqlqueue_orm.dialects` asks ``dialects.for_dialect(engine).field`` instead of
branching on ``dialect.name``. The hot-path receive/peek/send statements stay in
:mod:`sqlqueue_orm.queuing.sql` (one ``SqlText`` per dialect, reached here as :attr:`hot_path`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect, Engine

    from sqlqueue_orm.addressing import QueueAddress

#: Columns that make a table a queue table in NServiceBus's SQL Server layout, whatever its
#: name (Recoverable, CorrelationId and ReplyToAddress may have been dropped: NServiceBus 7+
#: tolerates that). SQLite tables have this layout too.
SQLSERVER_SIGNATURE = ("Id", "Expires", "Headers", "Body", "RowVersion")

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

    The defaults describe a database this package does not know (the rules it applied before:
    128 characters, no catalogs, no locks, no hints).
    """

    #: SQLAlchemy's ``dialect.name``.
    name: str
    #: Longest identifier (table, schema, catalog name) the database accepts.
    identifier_limit: int = 128
    #: What :attr:`identifier_limit` counts: ``"characters"`` or UTF-8 ``"bytes"``.
    identifier_unit: str = "characters"
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
    #: Whether idle receivers can be woken by ``LISTEN``/``NOTIFY`` (a trigger on the queue
    #: table; the statements are in :mod:`sqlqueue_orm.receiving.wakeup`).
    listen_notify: bool = False
    #: Whether the peek still counts a row whose receive has not committed (PostgreSQL's MVCC
    #: and SQLite's WAL readers do; SQL Server's peek reads past locked rows): the pump then
    #: subtracts the rows its own handlers hold.
    peek_counts_held_rows: bool = False
    #: How the flow-control claim of several slots gets its limits (receiving/flow.py):
    #: ``"json"``, one JSON document (OPENJSON on SQL Server); ``"grouped"``, scalar parameters
    #: for a few limits, beyond them a JSON array of names per limit (PostgreSQL).
    slot_claims: str = "json"
    #: How the .NET transport writes a queue address: ``"sqlserver"`` (``table@[schema]``)
    #: or ``"postgresql"`` (``"schema"."table"``).
    address_form: str = "sqlserver"
    #: The queue table layout: ``"sqlserver"`` or ``"postgresql"`` (NServiceBus's two).
    queue_layout: str = "sqlserver"
    #: The columns that make a table a queue table in :attr:`queue_layout`, in table order.
    queue_signature: tuple[str, ...] = SQLSERVER_SIGNATURE
    #: Whether index names are per table (SQL Server) rather than one namespace per schema.
    index_names_per_table: bool = False
    #: Whether QueueSettings.sql_server_layout (heap or clustered) applies.
    table_layouts: bool = False
    #: Whether a varchar (non-Unicode) Headers column is worth a warning.
    narrow_text_headers: bool = False
    #: Name of the optional computed BodyString column.
    body_string_column: str = "BodyString"
    #: ``ALTER TABLE`` adding that column: ``{expression}`` the body as text, ``{{table}}``.
    body_string_ddl: str = (
        'ALTER TABLE {{table}} ADD COLUMN "BodyString" TEXT GENERATED ALWAYS AS '
        "({expression}) VIRTUAL"
    )
    #: Table hint of every outbox claim (SQLAlchemy drops ``with_for_update()`` on SQL Server).
    claim_hint: str | None = None
    #: Table hint of a read of committed rows only, skipping rows still being written (a Spark
    #: ingest reading its batch) instead of waiting for them.
    committed_read_hint: str | None = None
    #: Transaction-scoped lock serializing queue installers (``:resource`` bound).
    install_lock: str | None = None
    #: Session-scoped lock taken without waiting, and its release (``:resource`` bound):
    #: one Spark ingester per queue. ``None``: the dialect locks a file instead.
    session_lock_acquire: str | None = None
    session_lock_release: str | None = None
    #: Between statements of a DDL script printed for a DBA.
    script_separator: str = ";\n"
    #: Lower-case fragments of driver errors: a missing table, a missing column, a transient
    #: failure (deadlock, serialization, lost connection) on this database.
    missing_table_markers: tuple[str, ...] = ()
    missing_column_markers: tuple[str, ...] = ()
    transient_markers: tuple[str, ...] = GENERIC_TRANSIENT

    # -- native delayed delivery (NServiceBus DelayedMessageTable) --------------------------
    # Templates: ``{table}`` the delayed table, ``{queue}`` the input queue it feeds, both quoted
    # by SQLAlchemy; ``:headers``, ``:body``, ``:due_ms`` (milliseconds from the database's
    # clock), ``:n`` (the batch), ``:now`` (where the dialect reads the clock in Python).
    #: The columns that make a table a delayed table, in table order.
    delayed_signature: tuple[str, ...] = ("Headers", "Body", "Due", "RowVersion")
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
    subscription_columns: tuple[str, str, str] = SUBSCRIPTION_COLUMNS
    #: Subscribe (an upsert on Endpoint and Topic): ``{table}``, ``:queue_address``,
    #: ``:endpoint``, ``:topic``.
    subscribe: str = SUBSCRIBE_UPSERT
    #: Unsubscribe: ``{table}``, ``:endpoint``, ``:topic``.
    unsubscribe: str = UNSUBSCRIBE
    #: The subscribers of some topics: ``{table}``, ``{topics}`` (a list of parameters).
    subscribers: str = SUBSCRIBERS

    # -- schema verification (sqlqueue_orm.verify) -------------------------------------
    #: The indexes of one table, one row per index and included column: name, partial-index
    #: predicate (or the whole ``CREATE INDEX`` holding it), clustered (0/1), an ``INCLUDE``
    #: column or NULL. ``:table`` is the table quoted by SQLAlchemy, ``:name`` its bare name.
    index_catalog: str = ""
    #: How a column's type or nullability is repaired: ``"alter"`` (each on its own),
    #: ``"restate"`` (one ALTER COLUMN naming type and nullability) or ``"rebuild"`` (the
    #: table is copied into a new one: SQLite cannot alter a column).
    alter_column: str = "alter"
    #: Storage settings of every queue table (``CREATE TABLE ... WITH``, ``ALTER TABLE ... SET``),
    #: as (name, value) pairs; ``()``: the database's own (see docs/scale.md for the figure).
    queue_storage: tuple[tuple[str, str], ...] = ()
    #: The storage settings a table has, one ``name=value`` a row: ``:table`` quoted.
    storage_catalog: str = ""
    #: Sets storage settings: ``{table}`` quoted by SQLAlchemy, ``{settings}`` ``name=value, ...``.
    storage_ddl: str = ""

    # -- statements to come (issues for the endpoint) -------------------------------------
    # PostgreSQL NOTIFY / LISTEN on send, to wake idle receivers.
    # Each becomes a field here, filled in by every dialect module.

    #: Flow control's statements (:class:`FlowStatements`); ``None``: limits hold per process.
    flow: FlowStatements | None = None

    @property
    def hot_path(self) -> Any:
        """The hot-path statements of this dialect (:class:`sqlqueue_orm.queuing.sql.SqlText`)."""
        from sqlqueue_orm.queuing import sql  # local: queuing/sql.py builds on this package

        return sql.DIALECTS[self.name]

    def identifier_size(self, value: str) -> int:
        """The size of identifier *value* in :attr:`identifier_unit`."""
        return len(value.encode("utf-8")) if self.identifier_unit == "bytes" else len(value)

    def create_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> Engine:
        """An engine for *url*, with what this dialect needs for queue work.

        :param sqlite_synchronous: SQLite's ``PRAGMA synchronous`` (other dialects ignore it).
        """
        return sa.create_engine(url, **kwargs)

    def take_install_lock(self, connection: Connection, address: QueueAddress) -> None:
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
GENERIC = DialectSupport(name="")


# -- flow control (sqlqueue_orm.receiving.flow) ----------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowStatements:
    """Flow control's statements on one database: slot claims, key leases, the rate schedule.

    A dialect without them (:attr:`DialectSupport.flow` ``None``) has no locks shared between
    processes: its limits hold within one process (SQLite).
    """

    #: Claim a free one of ``:k`` slots named ``:name`` in the caller's transaction, ``:first``
    #: tried first, then the next ones (modulo ``:k``): the slot number, or no row or -1 when
    #: every slot is held. One slot at most is claimed.
    claim_slot: str
    #: Claim one slot of each of several limits in one statement, each tried from ``:first`` on
    #: as :attr:`claim_slot` does: how many limits got one. A limit refused leaves the others'
    #: locks taken (the caller rolls the transaction back).
    claim_slots: str
    #: Whether :attr:`claim_slots` takes two groups of names (``:prefix_a``, ``:names_a`` (a
    #: JSON array), ``:k_a``, and the same for ``b``) rather than one JSON document ``:claims``
    #: of ``[name, limit, index]``.
    grouped_claims: bool = False
    #: The claim of 0, 1, ... limits with scalar parameters (``:name_a``, ``:k_a``, ...), by
    #: count; ``()``: every claim of several limits goes through :attr:`claim_slots`.
    few_claims: tuple[str, ...] = ()
    #: Columns that follow the receive's own RETURNING list: each row's key (``:pattern``)
    #: and the claim of that key's slot (``:prefix``, ``:k``), and the global slot's claim
    #: (``:gname``, ``:gk``; ``:gk`` 0: none). ``None``: the receive cannot claim.
    receive_claiming: str | None = None
    #: The global slot's claim alone as a column after the receive's RETURNING list.
    receive_gated: str | None = None
    #: Claim key slots for the session (``:prefix``, ``:names``, ``:k``, ``:first``): one row
    #: per name with its slot, NULL when all are held. ``None``: no session claims.
    lease: str | None = None
    #: Give back session slots: ``:held`` a JSON array of ``[name, slot]`` after ``:prefix``.
    unlease: str | None = None
    #: The server process of the session (compared with the one the driver connected to).
    backend: str | None = None
    #: Reserve the next ``:step`` seconds of the rate schedule ``:name`` in ``{table}``, at
    #: most ``:wait`` seconds ahead, ``:tau`` seconds of idle credit: the seconds until the
    #: reserved start, or no row or NULL when none is that close.
    reserve: str
    #: Whether :attr:`reserve` is one statement, atomic alone (run in autocommit).
    reserve_alone: bool = False

    def claiming_receive(self, receive: str, keys: bool) -> str:
        """*receive* (a receive ending with its RETURNING list) claiming slots as it takes rows.

        :param keys: the key slots and the global slot (:attr:`receive_claiming`); else the
            global slot alone (:attr:`receive_gated`).
        :raises ValueError: this database's receive cannot claim (or returns no columns).
        """
        columns = self.receive_claiming if keys else self.receive_gated
        if columns is None or " RETURNING " not in receive:
            raise ValueError("this dialect's receive cannot claim slots")
        return f"{receive}, {columns}"
