"""The bodies of the queue table steps in T-SQL, one function per step and direction.

Each takes the :class:`~sqlqueue_orm.migration.tsql.text.Target` and returns the lines of the
step's transaction; :class:`~sqlqueue_orm.migration.tsql.MssqlImpl` names them after the steps'
concerns in :data:`~sqlqueue_orm.migration.steps.STEPS`.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from sqlqueue_orm.migration import steps
from sqlqueue_orm.migration.tsql.text import (
    Lines,
    Target,
    adopt_index,
    if_block,
    includes_columns,
    index_exists,
    key_is,
    with_online,
)


def _expires_filter(target: Target) -> str:
    # SQL Server stores a filter as its normalized text in parentheses.
    return f"({steps.index_filter(target.index(steps.EXPIRES_INDEX), target.dialect)})"


def upgrade_expires_index(target: Target) -> Lines:
    """0001 up: Index_Expires on (Expires) INCLUDE (Id, RowVersion), nonclustered."""
    index = target.index(steps.EXPIRES_INDEX)
    name = str(index.name)

    def build(options: dict[str, str]) -> str:
        return target.create(index, with_options=options)

    shape = f"{key_is(target, 'Expires')} AND {includes_columns(target, ['Id', 'RowVersion'])}"
    wrong = f" AND NOT ({shape})"
    return [
        "-- adopt an index on (Expires) that has another name",
        *adopt_index(target, name, "Expires", "2"),
        f"-- {name} must be (Expires) INCLUDE (Id, RowVersion), nonclustered",
        *if_block(
            index_exists(target, name, " AND i.type = 2" + wrong),
            with_online(target, build, DROP_EXISTING="ON"),
            if_block(
                index_exists(target, name, " AND i.type <> 2"),
                [*target.statement(target.drop(index)), *with_online(target, build)],
                if_block(f"NOT {index_exists(target, name)}", with_online(target, build)),
            ),
        ),
    ]


def downgrade_expires_index(target: Target) -> Lines:
    """0001 down: drop Index_Expires."""
    index = target.index(steps.EXPIRES_INDEX)
    return if_block(index_exists(target, str(index.name)), target.statement(target.drop(index)))


def _headers_type(target: Target) -> str:
    return str(target.table.c.Headers.type.compile(dialect=target.dialect))


def _alter_headers(target: Target, type_sql: str) -> str:
    return f"ALTER TABLE {target.quoted} ALTER COLUMN {target.quote('Headers')} {type_sql} NOT NULL"


def _headers_column(target: Target, condition: str) -> str:
    return (
        "EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = @object_id "
        f"AND c.name = N'Headers' AND ({condition}))"
    )


def upgrade_headers_nvarchar(target: Target) -> Lines:
    """0002 up: Headers becomes nvarchar(max) NOT NULL (a varchar one is converted)."""
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
        *if_block(
            outdated,
            [
                *if_block(not_text, refuse),
                *target.statement(_alter_headers(target, _headers_type(target))),
            ],
        ),
    ]


def downgrade_headers_nvarchar(target: Target) -> Lines:
    """0002 down: Headers back to varchar(max), refused if a row holds what varchar cannot."""
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
        *if_block(
            _headers_column(target, "TYPE_NAME(c.system_type_id) = N'nvarchar'"),
            [
                *target.flag_query(lossy),
                *if_block("@flag = 1", refuse),
                *target.statement(_alter_headers(target, varchar)),
            ],
        ),
    ]


def _filter_expires(target: Target, filtered: bool) -> Lines:
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

    rebuild = with_online(target, build, DROP_EXISTING="ON")
    return if_block(index_exists(target, name, wrong), rebuild)


def upgrade_filter_expires_index(target: Target) -> Lines:
    """0003 up: Index_Expires filtered to rows with an Expires."""
    return _filter_expires(target, True)


def downgrade_filter_expires_index(target: Target) -> Lines:
    """0003 down: Index_Expires unfiltered again."""
    return _filter_expires(target, False)


def _sequential_key(target: Target, index: sa.Index, value: str) -> Lines:
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
        *if_block(
            "COL_LENGTH(N'sys.indexes', N'optimize_for_sequential_key') IS NOT NULL",
            ["SET @flag = 0;", check, *if_block("@flag = 1", target.dynamic(alter))],
        ),
    ]


def _row_version_builder(
    target: Target, index: sa.Index, clustered: bool
) -> Callable[[dict[str, str]], str]:
    def render(options: dict[str, str]) -> str:
        return target.create(index, clustered=clustered, with_options=options)

    return render


def _heap_actions(
    target: Target, index: sa.Index, model_options: dict[str, str]
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
            with_online(target, build, **model_options),
            with_online(target, build, **model_options, DROP_EXISTING="ON"),
        )
    build = _row_version_builder(target, index, False)
    kept = (
        f"PRINT N'queue ' + {target.name} + N': a heap (the NServiceBus 8+ layout); kept, "
        f"{name} nonclustered (rebuild it clustered with cluster_heaps)';"
    )
    not_on_row_version = index_exists(target, name, f" AND NOT ({key_is(target, 'RowVersion')})")
    return (
        f"-- {name} on (RowVersion), clustered unless the table is a heap (the NServiceBus 8+ "
        "layout): a heap is kept, its index nonclustered (cluster_heaps rebuilds it)",
        [kept, *with_online(target, build, **model_options)],
        [
            kept,
            *if_block(
                not_on_row_version,
                with_online(target, build, **model_options, DROP_EXISTING="ON"),
            ),
        ],
    )


def upgrade_rowversion_layout(target: Target) -> Lines:
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
        *with_online(target, _row_version_builder(target, index, False), **model_options),
    ]
    heap_comment, new_on_heap, nonclustered_on_heap = _heap_actions(target, index, model_options)
    clustered_on_other_keys = index_exists(
        target, name, f" AND i.type = 1 AND NOT ({key_is(target, 'RowVersion')})"
    )
    rebuild = with_online(
        target, _row_version_builder(target, index, True), **model_options, DROP_EXISTING="ON"
    )
    nonclustered_condition = index_exists(target, name, " AND i.type <> 1")
    lines = [
        "-- adopt an index on (RowVersion) that has another name",
        *adopt_index(target, name, "RowVersion", "1, 2"),
        heap_comment,
        *if_block(
            f"NOT {index_exists(target, name)}",
            if_block(other_clustered, keep_other, new_on_heap),
            if_block(
                f"{nonclustered_condition} AND NOT {other_clustered}",
                nonclustered_on_heap,
                if_block(clustered_on_other_keys, rebuild),
            ),
        ),
    ]
    if sequential == "ON":
        lines += _sequential_key(target, index, "ON")
    return lines


def downgrade_rowversion_layout(target: Target) -> Lines:
    """0004 down: OPTIMIZE_FOR_SEQUENTIAL_KEY off again; the index itself stays."""
    # v1 had the clustered index too (what the heap era dropped); only the 2019 option goes.
    return _sequential_key(target, target.index(steps.ROW_VERSION_INDEX), "OFF")
