"""T-SQL of the queue table steps: one guarded batch per named table, or a server-side loop.

Every batch reads the table's state from ``sys.indexes`` / ``sys.index_columns`` /
``sys.columns`` before acting, so it is idempotent, and runs each table in its own transaction
under ``SET XACT_ABORT ON`` (and the SET options filtered indexes need, which ``sqlcmd`` does not
start with). Online ``sqlqueue migrate`` runs the very same batches, so what a DBA
reads is what runs. Index builds use ``ONLINE = ON`` when the edition has it
(``SERVERPROPERTY('EngineEdition')`` 3 = Enterprise/Developer, 5 = Azure SQL Database,
8 = Managed Instance). ``OPTIMIZE_FOR_SEQUENTIAL_KEY`` (SQL Server 2019+) is set through dynamic
SQL after checking ``sys.indexes`` has the column, because older servers cannot even parse it.

Named batches carry the table's name in each statement; the looping batch finds queue tables
itself (a cursor over ``sys.tables`` checking the column signature) and runs the statements with
``QUOTENAME`` and ``sp_executesql``. Table names reach the text only quoted by SQLAlchemy's mssql
dialect (identifiers) or as ``N'...'`` literals it renders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, exceptions
from sqlqueue_orm.migration import impl, steps
from sqlqueue_orm.queuing import sql as queue_sql

#: Editions with online index operations: Enterprise/Developer, Azure SQL DB, Managed Instance.
ONLINE_EDITIONS = "3, 5, 8"
_INDENT = "    "

Lines = list[str]


def dialect() -> Dialect:
    """An mssql dialect for rendering (named paramstyle: nothing in a name is %-doubled)."""
    return mssql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]


def _literal(dialect: Dialect, text: str) -> str:
    """*text* as an ``N'...'`` literal, rendered by SQLAlchemy."""
    literal = sa.literal(text, mssql.NVARCHAR())
    return str(literal.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def comment(text: str) -> str:
    """*text* made safe for a ``--`` comment line (names may hold line breaks)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _block(lines: Iterable[str], depth: int = 1) -> Lines:
    return [(_INDENT * depth + line) if line else line for line in lines]


def _if(condition: str, then: Lines, otherwise: Lines | None = None) -> Lines:
    out = [f"IF {condition}", "BEGIN", *_block(then), "END"]
    if otherwise is not None:
        out += ["ELSE", "BEGIN", *_block(otherwise), "END"]
    return out


class _Target:
    """Renders statements for one named table, or for the loop's current table ``@table``."""

    def __init__(
        self,
        dialect: Dialect,
        address: addressing.QueueAddress | None,
        cluster_heaps: bool = False,
    ) -> None:
        self.dialect = dialect
        self.cluster_heaps = cluster_heaps
        self.looping = address is None
        if address is None:
            address = addressing.QueueAddress(steps.PLACEHOLDER_TABLE, steps.PLACEHOLDER_SCHEMA)
        self.table = steps.model_table(address)
        self.quoted = dialect.identifier_preparer.format_table(self.table)

    def literal(self, text: str) -> str:
        return _literal(self.dialect, text)

    @property
    def name(self) -> str:
        """A T-SQL expression of the table's quoted name."""
        return "@table" if self.looping else self.literal(self.quoted)

    def _dynamic(self, sql: str) -> Lines:
        parts: list[str] = []
        for number, piece in enumerate(sql.split(self.quoted)):
            if number:
                parts.append("@table")
            if piece:
                parts.append(self.literal(piece))
        expression = " + ".join(parts)
        return [f"SET @sql = {expression};", "EXEC sp_executesql @sql;"]

    def statement(self, sql: str) -> Lines:
        """*sql* (compiled for this target's table) as it runs here."""
        return self._dynamic(sql) if self.looping else [f"{sql};"]

    def dynamic(self, sql: str) -> Lines:
        """*sql* run through ``sp_executesql`` even for a named table (syntax old servers lack)."""
        if self.looping:
            return self._dynamic(sql)
        return [f"EXEC sp_executesql {self.literal(sql)};"]

    def flag_query(self, sql: str) -> Lines:
        """*sql*, which sets ``@flag``, run so ``@flag`` is set here."""
        if not self.looping:
            return ["SET @flag = 0;", f"{sql};"]
        return [
            "SET @flag = 0;",
            *self._dynamic(sql)[:1],
            "EXEC sp_executesql @sql, N'@flag bit OUTPUT', @flag = @flag OUTPUT;",
        ]

    def index(self, base: str) -> sa.Index:
        return steps.model_index(self.table, base, "mssql")

    def create(self, index: sa.Index, **kw: Any) -> str:
        return steps.compile_ddl(
            sa.schema.CreateIndex(_IMPL.variant(index, **kw)),
            self.dialect,
        )

    def drop(self, index: sa.Index) -> str:
        return steps.compile_ddl(sa.schema.DropIndex(index), self.dialect)

    def quote(self, name: str) -> str:
        return str(self.dialect.identifier_preparer.quote_identifier(name))


def _in_list(target: _Target, names: Sequence[str]) -> str:
    return "(" + ", ".join(target.literal(name) for name in names) + ")"


def _signature_count(target: _Target, object_id: str) -> str:
    return (
        f"(SELECT COUNT(*) FROM sys.columns WHERE object_id = {object_id} "
        f"AND name IN {_in_list(target, steps.SIGNATURE)})"
    )


def _index_exists(target: _Target, name: str, extra: str = "") -> str:
    return (
        "EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id "
        f"AND i.name = {target.literal(name)}{extra})"
    )


def _key_is(target: _Target, column: str) -> str:
    """The index ``i`` has exactly one key column, *column*."""
    return (
        "EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 "
        f"AND c.name = {target.literal(column)}) "
        "AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id "
        "AND ic.index_id = i.index_id AND ic.key_ordinal > 1)"
    )


def _includes(target: _Target, columns: Sequence[str]) -> str:
    """The index ``i`` INCLUDEs every one of *columns*."""
    return (
        "(SELECT COUNT(*) FROM sys.index_columns AS ic JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id "
        f"AND ic.is_included_column = 1 AND c.name IN {_in_list(target, columns)}) = {len(columns)}"
    )


def _online(target: _Target, build: Callable[[dict[str, str]], str], **options: str) -> Lines:
    """``IF @online = 1`` the statement WITH (..., ONLINE = ON), else without ONLINE."""
    online = target.statement(build({**options, "ONLINE": "ON"}))
    offline = target.statement(build(options))
    return _if("@online = 1", online, offline)


def _adopt(target: _Target, name: str, column: str, types: str) -> Lines:
    """Rename an index on exactly (*column*) that has another name to *name* (sp_rename)."""
    find = [
        "SET @index = NULL;",
        "SELECT TOP (1) @index = i.name FROM sys.indexes AS i",
        f"WHERE i.object_id = @object_id AND i.type IN ({types}) AND i.is_unique = 0 "
        "AND i.is_hypothetical = 0",
        f"    AND {_key_is(target, column)}",
        "ORDER BY i.type, i.index_id;",
    ]
    rename = [
        f"SET @sql = {target.name} + N'.' + QUOTENAME(@index);",
        f"EXEC sp_rename @objname = @sql, @newname = {target.literal(name)}, @objtype = N'INDEX';",
        f"PRINT N'queue ' + {target.name} + N': renamed index ' + QUOTENAME(@index) "
        f"+ N' to ' + {target.literal(target.quote(name))};",
    ]
    return _if(f"NOT {_index_exists(target, name)}", [*find, *_if("@index IS NOT NULL", rename)])


def _expires_filter(target: _Target) -> str:
    where = target.index(steps.EXPIRES_INDEX).dialect_options["mssql"]["where"]
    # SQL Server stores a filter as its normalized text in parentheses.
    text = where.compile(dialect=target.dialect, compile_kwargs={"include_table": False})
    return f"({text})"


def _expires_up(target: _Target) -> Lines:
    index = target.index(steps.EXPIRES_INDEX)
    name = str(index.name)

    def build(options: dict[str, str]) -> str:
        return target.create(index, with_options=options)

    wrong = f" AND NOT ({_key_is(target, 'Expires')} AND {_includes(target, ['Id', 'RowVersion'])})"
    return [
        "-- adopt an index on (Expires) that has another name",
        *_adopt(target, name, "Expires", "2"),
        f"-- {name} must be (Expires) INCLUDE (Id, RowVersion), nonclustered",
        *_if(
            _index_exists(target, name, " AND i.type = 2" + wrong),
            _online(target, build, DROP_EXISTING="ON"),
            _if(
                _index_exists(target, name, " AND i.type <> 2"),
                [*target.statement(target.drop(index)), *_online(target, build)],
                _if(f"NOT {_index_exists(target, name)}", _online(target, build)),
            ),
        ),
    ]


def _expires_down(target: _Target) -> Lines:
    index = target.index(steps.EXPIRES_INDEX)
    return _if(_index_exists(target, str(index.name)), target.statement(target.drop(index)))


def _headers_type(target: _Target) -> str:
    return str(target.table.c.Headers.type.compile(dialect=target.dialect))


def _alter_headers(target: _Target, type_sql: str) -> str:
    return f"ALTER TABLE {target.quoted} ALTER COLUMN {target.quote('Headers')} {type_sql} NOT NULL"


def _headers_column(target: _Target, condition: str) -> str:
    return (
        "EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id "
        f"AND c.name = N'Headers' AND ({condition}))"
    )


def _headers_up(target: _Target) -> Lines:
    not_text = _headers_column(
        target, "TYPE_NAME(c.system_type_id) NOT IN (N'varchar', N'nvarchar', N'text', N'ntext')"
    )
    refuse = [
        f"SET @message = N'queue ' + {target.name} + "
        "N': column [Headers] is neither varchar nor nvarchar; convert it by hand';",
        "THROW 50000, @message, 1;",
    ]
    outdated = _headers_column(
        target,
        "TYPE_NAME(c.system_type_id) <> N'nvarchar' OR c.max_length <> -1 OR c.is_nullable = 1",
    )
    return [
        "-- varchar -> nvarchar(max) keeps every character (each maps to Unicode); size-of-data",
        *_if(
            outdated,
            [
                *_if(not_text, refuse),
                *target.statement(_alter_headers(target, _headers_type(target))),
            ],
        ),
    ]


def _headers_down(target: _Target) -> Lines:
    varchar = str(mssql.VARCHAR().compile(dialect=target.dialect))  # no length: VARCHAR(max)
    headers = target.quote("Headers")
    lossy = (
        f"SELECT TOP (1) @flag = 1 FROM {target.quoted} WITH (TABLOCKX, HOLDLOCK) "
        f"WHERE CAST(CAST(CAST({headers} AS {varchar}) AS NVARCHAR(max)) AS VARBINARY(max)) "
        f"<> CAST({headers} AS VARBINARY(max))"
    )
    refuse = [
        f"SET @message = N'queue ' + {target.name} + "
        "N': some Headers hold characters varchar cannot store; not downgraded';",
        "THROW 50000, @message, 1;",
    ]
    return [
        "-- refuse to lose characters: check every row first (the table stays locked)",
        *_if(
            _headers_column(target, "TYPE_NAME(c.system_type_id) = N'nvarchar'"),
            [
                *target.flag_query(lossy),
                *_if("@flag = 1", refuse),
                *target.statement(_alter_headers(target, varchar)),
            ],
        ),
    ]


def _filter_expires(target: _Target, filtered: bool) -> Lines:
    index = target.index(steps.EXPIRES_INDEX)
    name = str(index.name)
    if filtered:
        wrong = (
            " AND (i.has_filter = 0 OR i.filter_definition <> "
            f"{target.literal(_expires_filter(target))})"
        )
    else:
        wrong = " AND i.has_filter = 1"

    def build(options: dict[str, str]) -> str:
        return target.create(index, where=filtered, with_options=options)

    return _if(_index_exists(target, name, wrong), _online(target, build, DROP_EXISTING="ON"))


def _filter_up(target: _Target) -> Lines:
    return _filter_expires(target, True)


def _filter_down(target: _Target) -> Lines:
    return _filter_expires(target, False)


def _sequential_key(target: _Target, index: sa.Index, value: str) -> Lines:
    """Set OPTIMIZE_FOR_SEQUENTIAL_KEY of *index* to *value* where the server knows it."""
    current = "0" if value == "ON" else "1"
    inner = (
        "SELECT @flag = 1 FROM sys.indexes WHERE object_id = @object_id "
        f"AND name = {target.literal(str(index.name))} AND optimize_for_sequential_key = {current}"
    )
    check = (
        f"EXEC sp_executesql {target.literal(inner)}, N'@object_id int, @flag bit OUTPUT', "
        "@object_id = @object_id, @flag = @flag OUTPUT;"
    )
    alter = (
        f"ALTER INDEX {target.quote(str(index.name))} ON {target.quoted} "
        f"SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = {value})"
    )
    return [
        "-- OPTIMIZE_FOR_SEQUENTIAL_KEY: SQL Server 2019+ and Azure SQL only",
        *_if(
            "COL_LENGTH(N'sys.indexes', N'optimize_for_sequential_key') IS NOT NULL",
            ["SET @flag = 0;", check, *_if("@flag = 1", target.dynamic(alter))],
        ),
    ]


def _row_version_builder(
    target: _Target, index: sa.Index, clustered: bool
) -> Callable[[dict[str, str]], str]:
    def render(options: dict[str, str]) -> str:
        return target.create(index, clustered=clustered, with_options=options)

    return render


def _heap_actions(
    target: _Target, index: sa.Index, model_options: dict[str, str]
) -> tuple[str, Lines, Lines]:
    """What 0004 does on a heap: its comment, with no Index_RowVersion, with a nonclustered one.

    NServiceBus 8+ (4.3.2, 5.0.3, 6.0.1 and later) creates a heap with a NONCLUSTERED
    Index_RowVersion, and .NET endpoints may share the table: rebuilding it clustered moves every
    row, so it happens only when the run asks for it (``cluster_heaps``, ``-x cluster_heaps=true``
    or ``sqlqueue migrate --cluster-heaps``); otherwise the heap is kept and the batch says so.
    """
    name = str(index.name)
    if target.cluster_heaps:
        build = _row_version_builder(target, index, True)
        return (
            f"-- {name} must be the clustered index on (RowVersion): asked to rebuild heaps",
            _online(target, build, **model_options),
            _online(target, build, **model_options, DROP_EXISTING="ON"),
        )
    build = _row_version_builder(target, index, False)
    kept = (
        f"PRINT N'queue ' + {target.name} + N': a heap (the NServiceBus 8+ layout); kept, "
        f"{name} nonclustered (rebuild it clustered with cluster_heaps)';"
    )
    not_on_row_version = _index_exists(target, name, f" AND NOT ({_key_is(target, 'RowVersion')})")
    return (
        f"-- {name} on (RowVersion), clustered unless the table is a heap (the NServiceBus 8+ "
        "layout): a heap is kept, its index nonclustered (cluster_heaps rebuilds it)",
        [kept, *_online(target, build, **model_options)],
        [
            kept,
            *_if(
                not_on_row_version,
                _online(target, build, **model_options, DROP_EXISTING="ON"),
            ),
        ],
    )


def _row_version_up(target: _Target) -> Lines:
    """Index_RowVersion on (RowVersion): clustered on our tables, never forced on a heap."""
    index = target.index(steps.ROW_VERSION_INDEX)
    name = str(index.name)
    model_options = dict(index.dialect_options["mssql"]["with"] or {})
    sequential = model_options.pop("OPTIMIZE_FOR_SEQUENTIAL_KEY", None)
    other_clustered = (
        "EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = @object_id AND type IN (1, 5)"
        f" AND name <> {target.literal(name)})"
    )
    keep_other = [
        f"PRINT N'queue ' + {target.name} + N': another clustered index exists; "
        f"{name} is created nonclustered';",
        *_online(target, _row_version_builder(target, index, False), **model_options),
    ]
    heap_comment, new_on_heap, nonclustered_on_heap = _heap_actions(target, index, model_options)
    clustered_on_other_keys = _index_exists(
        target, name, f" AND i.type = 1 AND NOT ({_key_is(target, 'RowVersion')})"
    )
    rebuild = _online(
        target, _row_version_builder(target, index, True), **model_options, DROP_EXISTING="ON"
    )
    nonclustered_condition = _index_exists(target, name, " AND i.type <> 1")
    lines = [
        "-- adopt an index on (RowVersion) that has another name",
        *_adopt(target, name, "RowVersion", "1, 2"),
        heap_comment,
        *_if(
            f"NOT {_index_exists(target, name)}",
            _if(other_clustered, keep_other, new_on_heap),
            _if(
                f"{nonclustered_condition} AND NOT {other_clustered}",
                nonclustered_on_heap,
                _if(clustered_on_other_keys, rebuild),
            ),
        ),
    ]
    if sequential == "ON":
        lines += _sequential_key(target, index, "ON")
    return lines


def _row_version_down(target: _Target) -> Lines:
    # v1 had the clustered index too (what the heap era dropped); only the 2019 option goes.
    return _sequential_key(target, target.index(steps.ROW_VERSION_INDEX), "OFF")


#: Filtered indexes need these session settings (sqlcmd starts with QUOTED_IDENTIFIER OFF);
#: NOCOUNT keeps row counts from hiding a later error from the driver.
_SETTINGS = (
    "SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;\n"
    "SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, "
    "ANSI_NULLS ON;"
)
_VARIABLES = (
    "DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) "
    f"IN ({ONLINE_EDITIONS}) THEN 1 ELSE 0 END;"
)
_WORK_VARIABLES = "DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;"


def _transaction(body: Lines) -> Lines:
    return ["BEGIN TRANSACTION;", *body, "COMMIT TRANSACTION;"]


def table_batch(
    revision: str,
    direction: str,
    address: addressing.QueueAddress,
    cluster_heaps: bool = False,
) -> str:
    """The batch applying step *revision* in *direction* to the queue table at *address*.

    :param cluster_heaps: rebuild a heap (NServiceBus 8+ layout) with a clustered
        Index_RowVersion; by default a heap is kept.
    """
    step = steps.step(revision, direction)
    target = _Target(dialect(), address, cluster_heaps)
    body: Lines = _IMPL.body(revision, direction)(target)
    skip = [f"PRINT N'queue ' + {target.name} + N': no queue table there; skipped';"]
    lines = [
        f"-- queue {comment(str(address))}: {step.describe(direction)}",
        _SETTINGS,
        f"DECLARE @object_id int = OBJECT_ID({target.name}, N'U');",
        _VARIABLES,
        _WORK_VARIABLES,
        *_if(
            f"@object_id IS NULL OR {_signature_count(target, '@object_id')} < "
            f"{len(steps.SIGNATURE)}",
            skip,
            _transaction(body),
        ),
    ]
    return "\n".join(lines)


def loop_batch(
    revision: str,
    direction: str,
    schemas: Sequence[str | None],
    cluster_heaps: bool = False,
) -> str:
    """The batch applying step *revision* in *direction* to every queue table in *schemas*.

    ``None`` in *schemas* stands for the default schema of the user running the script;
    *cluster_heaps* as in :func:`table_batch`.
    """
    step = steps.step(revision, direction)
    target = _Target(dialect(), None, cluster_heaps)
    body: Lines = _IMPL.body(revision, direction)(target)
    named = [schema for schema in schemas if schema is not None]
    conditions = []
    if named:
        conditions.append(f"s.name IN {_in_list(target, named)}")
    if None in schemas or not named:
        conditions.append("s.name = SCHEMA_NAME()")
    where = " OR ".join(conditions)
    described = ", ".join(
        "the default schema" if schema is None else target.quote(schema) for schema in schemas
    )
    fetch = "FETCH NEXT FROM queue_tables INTO @object_id, @table;"
    lines = [
        f"-- every queue table in {comment(described)}: {step.describe(direction)}",
        _SETTINGS,
        "DECLARE @object_id int, @table nvarchar(517);",
        _VARIABLES,
        _WORK_VARIABLES,
        "DECLARE queue_tables CURSOR LOCAL STATIC READ_ONLY FOR",
        "    SELECT t.object_id, QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)",
        "    FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id",
        f"    WHERE t.is_ms_shipped = 0 AND ({where})",
        f"        AND {_signature_count(target, 't.object_id')} = {len(steps.SIGNATURE)}",
        "    ORDER BY s.name, t.name;",
        "OPEN queue_tables;",
        fetch,
        "WHILE @@FETCH_STATUS = 0",
        "BEGIN",
        *_block(
            [
                f"PRINT N'queue ' + @table + N': {step.revision} {direction}';",
                *_transaction(body),
                fetch,
            ]
        ),
        "END",
        "CLOSE queue_tables;",
        "DEALLOCATE queue_tables",
    ]
    return "\n".join(lines)


def _n_literal(text: str) -> str:
    return "N'" + text.replace("'", "''") + "'"


def delayed_index_batch(schemas: Sequence[str | None]) -> str:
    """The batch creating the missing index on Due of the delayed tables of *schemas*.

    ``Index_Due`` (NServiceBus's CreateDelayedMessageStoreText: NONCLUSTERED on [Due]).

    A delayed table: ``Headers, Body, Due, RowVersion`` and no ``Expires``. Safe to run twice.
    """
    target = _Target(dialect(), None)
    named = [schema for schema in schemas if schema is not None]
    conditions = []
    if named:
        conditions.append(f"s.name IN {_in_list(target, named)}")
    if None in schemas or not named:
        conditions.append("s.name = SCHEMA_NAME()")
    signature = ("Headers", "Body", "Due", "RowVersion")
    described = ", ".join(
        "the default schema" if schema is None else target.quote(schema) for schema in schemas
    )
    fetch = "FETCH NEXT FROM delayed_tables INTO @table;"
    lines = [
        f"-- every delayed table in {comment(described)}: create its index on Due",
        "DECLARE @table nvarchar(517), @sql nvarchar(max);",
        "DECLARE delayed_tables CURSOR LOCAL STATIC READ_ONLY FOR",
        "    SELECT QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)",
        "    FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id",
        f"    WHERE t.is_ms_shipped = 0 AND ({' OR '.join(conditions)})",
        "        AND (SELECT COUNT(*) FROM sys.columns AS c WHERE c.object_id = t.object_id "
        f"AND c.name IN {_in_list(target, signature)}) = {len(signature)}",
        "        AND NOT EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = t.object_id "
        "AND c.name = N'Expires')",
        "        AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE ic.object_id = t.object_id AND ic.key_ordinal = 1 AND c.name = N'Due')",
        "    ORDER BY s.name, t.name;",
        "OPEN delayed_tables;",
        fetch,
        "WHILE @@FETCH_STATUS = 0",
        "BEGIN",
        *_block(
            [
                "PRINT N'delayed table ' + @table + N': 0009_delayed_delivery upgrade';",
                "SET @sql = N'CREATE NONCLUSTERED INDEX [Index_Due] ON ' + @table + N' ([Due])';",
                "EXEC sp_executesql @sql;",
                fetch,
            ]
        ),
        "END",
        "CLOSE delayed_tables;",
        "DEALLOCATE delayed_tables",
    ]
    return "\n".join(lines)


class MssqlImpl(impl.QueueTableImpl):
    """SQL Server: guarded T-SQL batches, one per table and step, the same online and offline."""

    __dialect__ = "mssql"
    offline = True

    # The steps, each named after its concern in steps.STEPS (Step.method).
    upgrade_expires_index = staticmethod(_expires_up)
    downgrade_expires_index = staticmethod(_expires_down)
    upgrade_headers_nvarchar = staticmethod(_headers_up)
    downgrade_headers_nvarchar = staticmethod(_headers_down)
    upgrade_filter_expires_index = staticmethod(_filter_up)
    downgrade_filter_expires_index = staticmethod(_filter_down)
    upgrade_rowversion_layout = staticmethod(_row_version_up)
    downgrade_rowversion_layout = staticmethod(_row_version_down)

    # -- the interface -------------------------------------------------------------------------
    def index_options(self, options: Any, variant: impl.IndexVariant) -> dict[str, Any]:
        """``mssql_clustered`` / ``_include`` / ``_where`` / ``_with`` of an index variant."""
        return {
            "mssql_clustered": (
                options["clustered"] if variant.clustered is None else variant.clustered
            ),
            "mssql_include": options["include"],
            "mssql_where": options["where"] if variant.where else None,
            "mssql_with": variant.with_options or None,
        }

    def table_statements(
        self, revision: str, direction: str, address: addressing.QueueAddress
    ) -> list[str]:
        """One batch: :func:`table_batch`."""
        return [table_batch(revision, direction, address, self.cluster_heaps)]

    def delayed_index_loop(self, schemas: Sequence[str | None]) -> str | None:
        """One batch: :func:`delayed_index_batch`."""
        return delayed_index_batch(schemas)

    def loop_statements(
        self, revision: str, direction: str, schemas: Sequence[str | None]
    ) -> list[str]:
        """One batch: :func:`loop_batch`."""
        return [loop_batch(revision, direction, schemas, self.cluster_heaps)]

    def execute(
        self, connection: Connection, statements: Sequence[str], address: addressing.QueueAddress
    ) -> None:
        """Run each T-SQL batch on the raw cursor, draining every result so no error hides."""
        dbapi_error = connection.dialect.loaded_dbapi.Error
        for batch in statements:
            cursor = connection.connection.cursor()
            try:
                cursor.execute(batch)
                while cursor.nextset():
                    pass
            except dbapi_error as error:
                raise exceptions.DatabaseError(f"queue {str(address)!r}: {error}") from error
            finally:
                cursor.close()

    def layout(self, connection: Connection, address: addressing.QueueAddress) -> impl.Layout:
        """Each column's type, and every column of ``sys.indexes``.

        Whatever the server version has: 2019+ adds ``optimize_for_sequential_key``, which 0004
        sets.
        """
        table = queue_sql.format_table(connection.dialect, address)
        indexes = sa.text(
            "SELECT i.* FROM sys.indexes AS i WHERE i.object_id = OBJECT_ID(:table) "
            "ORDER BY i.index_id"
        ).bindparams(table=table)
        columns = sa.text(
            "SELECT c.name, TYPE_NAME(c.user_type_id), c.max_length, c.is_nullable, "
            "c.is_identity FROM sys.columns AS c WHERE c.object_id = OBJECT_ID(:table) "
            "ORDER BY c.column_id"
        ).bindparams(table=table)
        return [tuple(row) for row in connection.execute(columns)] + [
            tuple(row) for row in connection.execute(indexes)
        ]

    def count(self, connection: Connection, address: addressing.QueueAddress) -> int:
        """From the catalog: a ``COUNT(*)`` would scan (and lock) a big queue for nothing."""
        statement = sa.text(
            "SELECT COALESCE(SUM(rows), 0) FROM sys.partitions "
            "WHERE object_id = OBJECT_ID(:table) AND index_id IN (0, 1)"
        ).bindparams(table=queue_sql.format_table(connection.dialect, address))
        return int(connection.execute(statement).scalar_one())

    def guarded_create_table(
        self, dialect: Dialect, name: str, elements: Sequence[sa.schema.SchemaItem]
    ) -> str | None:
        """``IF OBJECT_ID(...) IS NULL`` around the ``CREATE TABLE``."""
        table = sa.Table(name, sa.MetaData(), *elements)
        create = steps.compile_ddl(sa.schema.CreateTable(table), dialect)
        quoted = dialect.identifier_preparer.format_table(table)
        return f"IF OBJECT_ID({_n_literal(quoted)}, N'U') IS NULL\nBEGIN\n{create}\nEND"

    def guarded_create_index(
        self,
        dialect: Dialect,
        name: str,
        table: str,
        columns: Sequence[str],
        kwargs: dict[str, Any],
    ) -> str | None:
        """``IF NOT EXISTS (SELECT 1 FROM sys.indexes ...)`` before the ``CREATE INDEX``."""
        model = sa.Table(table, sa.MetaData(), *(sa.Column(column) for column in columns))
        index = sa.Index(name, *(model.c[column] for column in columns), **kwargs)
        create = steps.compile_ddl(sa.schema.CreateIndex(index), dialect)
        quoted = dialect.identifier_preparer.format_table(model)
        # A filtered index needs these SET options in the session that creates it.
        options = "SET ANSI_NULLS, QUOTED_IDENTIFIER ON;\n" if "WHERE" in create else ""
        return (
            f"{options}IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = {_n_literal(name)} "
            f"AND object_id = OBJECT_ID({_n_literal(quoted)}))\n{create}"
        )


_IMPL = MssqlImpl()
