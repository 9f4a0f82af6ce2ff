"""SQL Server: NServiceBus's reference dialect (compiled and golden-tested; no server here)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import config, exceptions
from sqlqueue_orm.dialects import base, control, flow, statements

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect, Engine

#: ``--target-version`` years and the SQL Server major version of each.
SQL_SERVER_MAJOR = config.SQL_SERVER_MAJOR

# Explicit CASTs: the driver may bind NULL without a type, and SQL Server cannot deduce one there.
_EXPIRES = (
    "CASE WHEN CAST(:ttbr AS bigint) IS NULL THEN NULL "
    "ELSE DATEADD(ms, CAST(:ttbr AS bigint) % 86400000, "
    "DATEADD(day, CAST(:ttbr AS bigint) / 86400000, GETUTCDATE())) END"
)

#: The hot path (NServiceBus's SqlServerConstants: send, receive, peek, purge).
HOT_PATH = statements.SqlText(
    expired_read=(
        "CASE WHEN {expires} IS NULL THEN 0 WHEN {expires} > GETUTCDATE() THEN 0 ELSE 1 END"
    ),
    # TTBR is split into days and milliseconds: DATEADD(ms, ...) alone overflows past 24.8 days.
    send=(
        "INSERT INTO {table} ([Id], [Recoverable], [Expires], [Headers], [Body]) "
        f"VALUES (:id, 1, {_EXPIRES}, :headers, :body)"
    ),
    send_without_recoverable=(
        "INSERT INTO {table} ([Id], [Expires], [Headers], [Body]) "
        f"VALUES (:id, {_EXPIRES}, :headers, :body)"
    ),
    # Headers come back as their UTF-16LE bytes, decoded in Python (headers_encoding): nvarchar
    # holds any UTF-16 code units, an unpaired surrogate too, and pyodbc's strict decoding would
    # fail the whole fetch on one, blocking the queue behind that row. (NServiceBus reads
    # deleted.Headers as it is; .NET strings take unpaired surrogates.) The inner CAST reads a
    # legacy varchar column as Unicode first.
    receive=(
        "WITH message AS (SELECT TOP(:n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "ORDER BY [RowVersion]) "
        "DELETE FROM message "
        "OUTPUT deleted.[Id], deleted.[RowVersion], "
        "CASE WHEN deleted.[Expires] IS NULL THEN 0 "
        "WHEN deleted.[Expires] > GETUTCDATE() THEN 0 ELSE 1 END, "
        "CAST(CAST(deleted.[Headers] AS nvarchar(max)) AS varbinary(max)), deleted.[Body];"
    ),
    # READCOMMITTEDLOCK: READPAST needs locking reads, which RCSI (Azure SQL's default) turns off.
    peek=(
        "SELECT ISNULL(CAST(MAX([RowVersion]) - MIN([RowVersion]) + 1 AS bigint), 0) "
        "FROM {table} WITH (READPAST, READCOMMITTEDLOCK);"
    ),
    # Same lock order as receive (UPDLOCK, READPAST, ROWLOCK by RowVersion): no deadlock with it
    # (NServiceBus #308 came from the purge locking rows in another order).
    purge_expired=(
        "WITH message AS (SELECT TOP(:n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE [Expires] < GETUTCDATE() ORDER BY [RowVersion]) "
        "DELETE FROM message;"
    ),
    purge_all="DELETE FROM {table};",
    # Id has no index on SQL Server (nor in NServiceBus's layout): the error queue is small,
    # and READPAST skips a row another retry or delete holds instead of waiting for it.
    receive_by_id=(
        "WITH message AS (SELECT TOP(1) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE [Id] = :id) "
        "DELETE FROM message "
        "OUTPUT deleted.[Id], deleted.[RowVersion], "
        "CASE WHEN deleted.[Expires] IS NULL THEN 0 "
        "WHEN deleted.[Expires] > GETUTCDATE() THEN 0 ELSE 1 END, "
        "CAST(CAST(deleted.[Headers] AS nvarchar(max)) AS varbinary(max)), deleted.[Body];"
    ),
    id_to_driver=str,
    headers_encoding="utf-16-le",
    headers_read="CAST(CAST({headers} AS nvarchar(max)) AS varbinary(max))",
)

#: Serializes installers: the lock lives until the installing transaction ends (so an error
#: that rolls it back also releases it, which NServiceBus 6.3.1+ does with TRY/CATCH). The
#: resource goes through varchar as NServiceBus's '...' literal does (characters outside the
#: database's code page become '?' on both sides), then to sp_getapplock's nvarchar(255).
INSTALL_LOCK = (
    "DECLARE @status int, @resource nvarchar(255) = CAST(:resource AS varchar(8000)); "
    "EXEC @status = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
    "@LockOwner = 'Transaction', @LockTimeout = 60000; SELECT @status"
)
#: What NServiceBus's default catalog and schema are on this connection.
CATALOG_AND_SCHEMA = "SELECT DB_NAME(), SCHEMA_NAME()"

#: Delayed delivery, after NServiceBus's SqlServerConstants (StoreDelayedMessageText,
#: MoveDueDelayedMessageText), Particular/NServiceBus.SqlServer: the due time is the database's
#: clock plus the delay (days and milliseconds apart: DATEADD(ms, ...) alone overflows past 24.8
#: days); matured rows move with one DELETE ... OUTPUT INTO the input queue, skipping rows
#: another mover holds (UPDLOCK, READPAST, ROWLOCK), oldest due first.
DELAYED_STORE = (
    "INSERT INTO {table} ([Headers], [Body], [Due]) VALUES (:headers, :body, "
    "DATEADD(ms, CAST(:due_ms AS bigint) % 86400000, "
    "DATEADD(day, CAST(:due_ms AS bigint) / 86400000, GETUTCDATE())))"
)
DELAYED_MOVE = (
    "WITH message AS (SELECT TOP(:n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
    "WHERE [Due] < GETUTCDATE() ORDER BY [Due]) "
    "DELETE FROM message "
    "OUTPUT NEWID(), NULL, NULL, 1, NULL, deleted.[Headers], deleted.[Body] "
    "INTO {queue} ([Id], [CorrelationId], [ReplyToAddress], [Recoverable], [Expires], "
    "[Headers], [Body]);"
)
DELAYED_NEXT_DUE = (
    "SELECT TOP 1 DATEDIFF_BIG(ms, GETUTCDATE(), [Due]) / 1000.0 "
    "FROM {table} WITH (READPAST) ORDER BY [Due]"
)


def _bracket(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


def lock_resource(catalog: str, schema: str, table: str) -> str:
    """The applock resource NServiceBus's SQL Server installer takes for this table.

    ``EXEC sp_getapplock @Resource = '{0}_lock'`` with ``{0}`` the table's QualifiedTableName,
    ``[catalog].[schema].[table]`` bracketed by SqlServerNameHelper.Quote (``]`` doubled):
    CreateQueueText in ``src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs``
    and ``Addressing/CanonicalQueueAddress.cs``, Particular/NServiceBus.SqlServer 214c4e8f.
    Both installers then serialize on one lock, so racing on a first start never fails.
    """
    return f"{_bracket(catalog)}.{_bracket(schema)}.{_bracket(table)}_lock"

#: Indexes of ``:table`` (its quoted name, for OBJECT_ID): the filter of a filtered index,
#: whether it is the clustered one (type 1), and its INCLUDE columns, one a row.
INDEX_CATALOG = (
    "SELECT i.name, i.filter_definition, CASE WHEN i.type = 1 THEN 1 ELSE 0 END, c.name "
    "FROM sys.indexes AS i "
    "LEFT JOIN sys.index_columns AS ic ON ic.object_id = i.object_id "
    "AND ic.index_id = i.index_id AND ic.is_included_column = 1 "
    "LEFT JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
    "WHERE i.object_id = OBJECT_ID(:table)"
)


#: pyodbc's connection parameters bounding a wait on the network (``connect_args`` and the URL's
#: query override them): a login gives up after ``timeout`` seconds. Idle connections need
#: nothing more: Microsoft's ODBC drivers send TCP keepalives by default (``KeepAlive``, 30 s,
#: then every ``KeepAliveInterval``, 1 s). No query timeout: it would cancel a handler's
#: statement the server is merely busy with.
CONNECT_DEFAULTS: tuple[tuple[str, object], ...] = (("timeout", 5),)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MssqlSupport(base.DialectSupport):
    """SQL Server: applocks, table hints, ``DELETE TOP``, catalog views."""

    def create_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> Engine:
        """An engine; pyodbc sends parameter batches in one round trip (``fast_executemany``).

        pyodbc's connections get :data:`CONNECT_DEFAULTS` (:meth:`connect_args`).
        """
        if url.get_driver_name() == "pyodbc":
            kwargs.setdefault("fast_executemany", True)
            kwargs["connect_args"] = self.connect_args(url, kwargs.get("connect_args") or {})
        return sa.create_engine(url, **kwargs)

    def reserved_name(self, table: str, schema: str | None) -> str | None:
        """SQL Server's catalog: the ``sys`` and ``INFORMATION_SCHEMA`` schemas (any case)."""
        if schema is not None and schema.lower() in ("sys", "information_schema"):
            return f"schema {schema!r} is SQL Server's own"
        return None

    def take_install_lock(self, connection: Connection, address: base.QualifiedName) -> None:
        """``sp_getapplock`` on NServiceBus's resource (catalog, schema as the server has them)."""
        if address.catalog is not None and address.schema is not None:
            resource = lock_resource(address.catalog, address.schema, address.table)
        else:
            catalog, schema = connection.execute(sa.text(CATALOG_AND_SCHEMA)).one()
            resource = lock_resource(
                address.catalog or str(catalog), address.schema or str(schema), address.table
            )
        status = connection.execute(sa.text(INSTALL_LOCK), {"resource": resource}).scalar()
        if status is None or int(status) < 0:
            raise exceptions.DatabaseError(
                f"queue {str(address)!r}: could not take the install lock (sp_getapplock {status})",
                transient=True,
            )

    def batched_delete(
        self, table: sa.Table, keys: tuple[str, ...], condition: sa.ColumnElement[bool], text: str
    ) -> sa.Executable:
        """NServiceBus's ``DELETE TOP`` with ``ROWLOCK, READPAST`` (and ``MAXDOP 1``)."""
        name = self.ddl_dialect().identifier_preparer.format_table(table)
        return sa.text(
            f"DELETE TOP (:batch_size) FROM {name} WITH (ROWLOCK, READPAST) "
            f"WHERE {text} OPTION (MAXDOP 1)"
        ).bindparams(
            sa.bindparam("batch_size", type_=sa.Integer()),
            sa.bindparam("cutoff", type_=sa.DateTime()),
        )

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """SQL Server's dialect, as of *target_version* (a year) if given."""
        # Imported on first use: a process on another database never needs it.
        from sqlalchemy.dialects import mssql

        dialect: Dialect = mssql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]
        if target_version is not None:
            dialect.server_version_info = (SQL_SERVER_MAJOR.get(target_version, 16),)
        return dialect


#: NServiceBus's subscribe on SQL Server (SqlServerConstants.SubscribeText,
#: src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs, 214c4e8f): a MERGE under
#: HOLDLOCK, TABLOCK, so two subscribers racing on one key never both insert.
SUBSCRIBE_MERGE = (
    "MERGE {table} WITH (HOLDLOCK, TABLOCK) AS target "
    "USING(SELECT :endpoint AS Endpoint, :queue_address AS QueueAddress, :topic AS Topic) "
    "AS source "
    "ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic "
    "WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN "
    "UPDATE SET QueueAddress = :queue_address "
    "WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) "
    "VALUES (:queue_address, :topic, :endpoint);"
)

#: An endpoint's control row, upserted the way that holds on SQL Server: an UPDATE under
#: UPDLOCK and SERIALIZABLE (which, when no row matches, locks the key's range until the
#: transaction ends, so a second upsert of the same endpoint waits instead of inserting too),
#: then the INSERT when it changed nothing. Not MERGE: without HOLDLOCK it races on the insert,
#: and the two statements say what they do. Runs in the caller's transaction.
CONTROL_UPSERTS = control.ControlStatements(
    set_paused=(
        "SET NOCOUNT ON; "
        "UPDATE {table} WITH (UPDLOCK, SERIALIZABLE) SET paused = :paused, "
        "changed_at = :changed_at, changed_by = :changed_by WHERE endpoint = :endpoint; "
        "IF @@ROWCOUNT = 0 "
        "INSERT INTO {table} (endpoint, paused, concurrency, changed_at, changed_by) "
        "VALUES (:endpoint, :paused, NULL, :changed_at, :changed_by);"
    ),
    set_concurrency=(
        "SET NOCOUNT ON; "
        "UPDATE {table} WITH (UPDLOCK, SERIALIZABLE) SET concurrency = :concurrency, "
        "changed_at = :changed_at, changed_by = :changed_by WHERE endpoint = :endpoint; "
        "IF @@ROWCOUNT = 0 "
        "INSERT INTO {table} (endpoint, paused, concurrency, changed_at, changed_by) "
        "VALUES (:endpoint, :paused, :concurrency, :changed_at, :changed_by);"
    ),
)


def _applock_granted(status: Any) -> bool:
    """sp_getapplock's status is >= 0 when the lock is granted."""
    return status is not None and int(status) >= 0


#: One Spark ingester per queue: ``sp_getapplock`` owned by the session, held across
#: transactions.
SESSION_LOCK = statements.SessionLock(
    acquire=(
        "DECLARE @status int; "
        "EXEC @status = sp_getapplock @Resource = :resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Session', @LockTimeout = 0; SELECT @status"
    ),
    release="EXEC sp_releaseapplock @Resource = :resource, @LockOwner = 'Session'",
    granted=_applock_granted,
)

#: A Spark stream's end offset: a range scan with READCOMMITTEDLOCK and without READPAST waits
#: for rows still being inserted above the start.
STREAM_FENCE = statements.StreamFence(
    kind=statements.FenceKind.LOCKING_SCAN, scan_hint="WITH (READCOMMITTEDLOCK)"
)

# -- flow control (sqlqueue_orm.receiving.flow): sp_getapplock -------------------------------
# A slot is an application lock owned by the transaction, named ``sqlqueue.slots.`` + the
# SHA-256 of the lock name + ``.`` + the slot; every claim tries ``:first`` first, then the next
# slots modulo the limit. EXEC takes variables, not expressions: the resource name is built in
# @resource first.
FLOW_CLAIM_SLOT = (
    "SET NOCOUNT ON; "
    "DECLARE @k int = :k, @first int = :first, @slot int = 0, @result int, "
    "@resource nvarchar(255), "
    "@base nvarchar(64) = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
    "CAST(:name AS nvarchar(4000))), 2); "
    "WHILE @slot < @k BEGIN "
    "SET @resource = N'sqlqueue.slots.' + @base + N'.' "
    "+ CAST((@slot + @first) % @k AS nvarchar(10)); "
    "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
    "@LockOwner = 'Transaction', @LockTimeout = 0; "
    "IF @result >= 0 BREAK; "
    "SET @slot += 1; "
    "END; "
    "SELECT CASE WHEN @slot < @k THEN (@slot + @first) % @k ELSE -1 END;"
)
#: :claims is a JSON array of [name, limit, index] (SQL Server 2016+: OPENJSON; a schema, not
#: JSON_VALUE, which gives NULL past 4,000 characters); the loop stops at the first limit
#: refused.
FLOW_CLAIM_SLOTS = (
    "SET NOCOUNT ON; "
    "DECLARE @first int = :first, @i int = 0, @n int, @k int, @slot int, @result int, "
    "@name nvarchar(max), @base nvarchar(64), @resource nvarchar(255); "
    "DECLARE @wanted TABLE (i int PRIMARY KEY, name nvarchar(max), k int); "
    "INSERT INTO @wanted (i, name, k) SELECT i, name, k "
    "FROM OPENJSON(CAST(:claims AS nvarchar(max))) "
    "WITH (name nvarchar(max) '$[0]', k int '$[1]', i int '$[2]'); "
    "SELECT @n = COUNT(*) FROM @wanted; "
    "WHILE @i < @n BEGIN "
    "SELECT @name = name, @k = k FROM @wanted WHERE i = @i; "
    "SET @base = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
    "CAST(@name AS nvarchar(4000))), 2); "
    "SET @slot = 0; SET @result = -1; "
    "WHILE @slot < @k AND @result < 0 BEGIN "
    "SET @resource = N'sqlqueue.slots.' + @base + N'.' "
    "+ CAST((@slot + @first) % @k AS nvarchar(10)); "
    "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
    "@LockOwner = 'Transaction', @LockTimeout = 0; "
    "SET @slot += 1; "
    "END; "
    "IF @result < 0 BREAK; "
    "SET @i += 1; "
    "END; "
    "SELECT @i;"
)
#: The rate schedule's reservation: the row is locked first, the clock read after.
FLOW_RESERVE = (
    "SET NOCOUNT ON; "
    "DECLARE @tau float = :tau, @step float = :step, @wait float = :wait, @next float, "
    "@now float, @slot float; "
    "SELECT @next = next_at FROM {table} WITH (UPDLOCK, ROWLOCK) WHERE name = :name; "
    "SET @now = DATEDIFF_BIG(microsecond, '19700101', SYSUTCDATETIME()) / 1e6; "
    "SET @slot = CASE WHEN @next > @now - @tau THEN @next ELSE @now - @tau END; "
    "IF @slot - @now <= @wait "
    "UPDATE {table} SET next_at = @slot + @step WHERE name = :name; "
    "ELSE SET @slot = NULL; "
    "SELECT @slot - @now;"
)

FLOW = flow.FlowStatements(
    claim_slot=FLOW_CLAIM_SLOT, claim_slots=FLOW_CLAIM_SLOTS, reserve=FLOW_RESERVE
)

# Every field stated by name, in the same shape as the other dialect modules' SUPPORT and
# base.GENERIC, on purpose: each database states its own tables, statements and errors, so
# none takes another's value by omission (tests/unit/test_every_dialect_states_its_layout.py).
SUPPORT = MssqlSupport(
    hot_path=HOT_PATH,
    connect_defaults=CONNECT_DEFAULTS,
    body_contains="CHARINDEX(:needle, {body}) > 0",
    session_lock=SESSION_LOCK,
    stream_fence=STREAM_FENCE,
    delayed_store=DELAYED_STORE,
    delayed_move=(DELAYED_MOVE,),
    delayed_next_due=DELAYED_NEXT_DUE,
    name="mssql",
    index_catalog=INDEX_CATALOG,
    alter_column="restate",
    identifier_limit=128,
    cross_catalog=True,
    creates_schemas=True,
    index_names_per_table=True,
    table_layouts=True,
    narrow_text_headers=True,
    # The cast NServiceBus's AddMessageBodyStringColumn makes (UTF-8 bodies come out garbled
    # there, as in NServiceBus, PR #453).
    body_string_ddl="ALTER TABLE {table} ADD [BodyString] AS CAST([Body] AS NVARCHAR(max))",
    system_schemas=frozenset({"information_schema", "sys", "guest"}),
    system_schema_prefixes=("db_",),  # the fixed database roles' schemas (db_owner, ...)
    # Skip rows another dispatcher holds, lock only rows.
    claim_hint="WITH (UPDLOCK, READPAST, ROWLOCK)",
    committed_read_hint="WITH (READPAST, READCOMMITTEDLOCK)",
    install_lock=INSTALL_LOCK,
    script_separator="\nGO\n",
    missing_table_markers=("invalid object name",),
    missing_column_markers=("invalid column name",),
    transient_markers=(*base.GENERIC_TRANSIENT, "1205"),  # 1205: deadlock victim
    subscribe=SUBSCRIBE_MERGE,
    control=CONTROL_UPSERTS,
    flow=FLOW,
    driver_extra="mssql",
    async_driver="aioodbc",
    identifier_unit="characters",
    address_form=base.AddressForm.BRACKETED,
    queue_layout=base.QueueLayout.ROW_VERSION,
    queue_signature=base.SQLSERVER_SIGNATURE,
    body_string_column="BodyString",
    delayed_signature=base.DELAYED_SIGNATURE,
    subscription_columns=base.SUBSCRIPTION_COLUMNS,
    unsubscribe=base.UNSUBSCRIBE,
    subscribers=base.SUBSCRIBERS,
)
