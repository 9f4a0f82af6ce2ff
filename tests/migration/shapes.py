"""A queue table's shape read straight from the catalogs, to compare tables by inspection.

Columns (type, nullability, identity/autoincrement, default kind) and indexes (name, unique,
clustered, key columns, INCLUDE columns, filter). Independent of the code under test: plain
catalog queries per dialect.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from testsupport.legacy import Names


def _normalized(predicate: str | None) -> str | None:
    if predicate is None:
        return None
    return re.sub(r"[\s\"'`\[\]()]", "", predicate).lower()


def describe(connection: Connection, table: str, schema: str | None) -> dict[str, Any]:
    """The shape of *table* in *schema*: ``{"columns": [...], "indexes": {...}, ...}``."""
    name = connection.dialect.name
    if name == "postgresql":
        return _postgresql(connection, table, schema)
    if name == "sqlite":
        return _sqlite(connection, table, schema)
    return _mssql(connection, table, schema)


def _postgresql(connection: Connection, table: str, schema: str | None) -> dict[str, Any]:
    relation = Names(connection.dialect, table, schema).qualified
    oid = connection.execute(sa.text("SELECT to_regclass(:r)::oid"), {"r": relation}).scalar_one()
    columns = [
        tuple(row)
        for row in connection.execute(
            sa.text(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
                "a.attidentity::text, "
                "CASE WHEN d.adbin IS NULL THEN NULL "
                "WHEN pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%' THEN 'serial' "
                "ELSE pg_get_expr(d.adbin, d.adrelid) END, "
                "(SELECT s.seqincrement FROM pg_sequence AS s WHERE s.seqrelid = "
                " pg_get_serial_sequence(CAST(:r AS text), a.attname)::regclass) "
                "FROM pg_attribute AS a "
                "LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                "WHERE a.attrelid = :oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
            ),
            {"oid": oid, "r": relation},
        )
    ]
    indexes = {}
    for row in connection.execute(
        sa.text(
            "SELECT ic.relname, i.indisunique, i.indisvalid, am.amname, "
            "ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true) "
            "      FROM generate_series(1, i.indnkeyatts) AS k ORDER BY k), "
            "ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true) "
            "      FROM generate_series(i.indnkeyatts + 1, i.indnatts) AS k ORDER BY k), "
            "pg_get_expr(i.indpred, i.indrelid), i.indisclustered "
            "FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid "
            "JOIN pg_am AS am ON am.oid = ic.relam WHERE i.indrelid = :oid"
        ),
        {"oid": oid},
    ):
        indexes[row[0]] = {
            "unique": row[1],
            "valid": row[2],
            "method": row[3],
            "keys": list(row[4]),
            "include": sorted(row[5]),
            "where": _normalized(row[6]),
            "clustered": row[7],
        }
    return {"columns": columns, "indexes": indexes}


def _sqlite(connection: Connection, table: str, schema: str | None) -> dict[str, Any]:
    database = schema or "main"
    quoted_db = connection.dialect.identifier_preparer.quote_identifier(database)
    columns = [
        (row[0], row[1].upper(), bool(row[2]), row[3], row[4], row[5])
        for row in connection.execute(
            sa.text(
                'SELECT name, type, "notnull", dflt_value, pk, hidden '
                "FROM pragma_table_xinfo(:t, :s) ORDER BY cid"
            ),
            {"t": table, "s": database},
        )
    ]
    table_sql = connection.execute(
        sa.text(f"SELECT sql FROM {quoted_db}.sqlite_master WHERE type = 'table' AND name = :t"),
        {"t": table},
    ).scalar_one()
    indexes = {}
    for row in connection.execute(
        sa.text('SELECT name, "unique", origin, partial FROM pragma_index_list(:t, :s)'),
        {"t": table, "s": database},
    ):
        info = list(
            connection.execute(
                sa.text(
                    "SELECT name, key FROM pragma_index_xinfo(:i, :s) WHERE cid >= 0 ORDER BY seqno"
                ),
                {"i": row[0], "s": database},
            )
        )
        sql = connection.execute(
            sa.text(
                f"SELECT sql FROM {quoted_db}.sqlite_master WHERE type = 'index' AND name = :i"
            ),
            {"i": row[0]},
        ).scalar()
        where = None
        if row[3]:
            where = _normalized(sql.rsplit(" WHERE ", 1)[1])
        indexes[row[0]] = {
            "unique": bool(row[1]),
            "origin": row[2],
            "keys": [item[0] for item in info if item[1]],
            "where": where,
        }
    return {
        "columns": columns,
        "autoincrement": "PRIMARY KEY AUTOINCREMENT" in table_sql.upper(),
        "indexes": indexes,
    }


def _mssql(connection: Connection, table: str, schema: str | None) -> dict[str, Any]:
    relation = Names(connection.dialect, table, schema).qualified
    object_id = connection.execute(
        sa.text("SELECT OBJECT_ID(:r, N'U')"), {"r": relation}
    ).scalar_one()
    columns = [
        tuple(row)
        for row in connection.execute(
            sa.text(
                "SELECT c.name, TYPE_NAME(c.system_type_id), c.max_length, c.is_nullable, "
                "c.is_identity, CAST(IDENTITYPROPERTY(c.object_id, 'IncrementValue') AS bigint) "
                "FROM sys.columns AS c WHERE c.object_id = :o ORDER BY c.column_id"
            ),
            {"o": object_id},
        )
    ]
    indexes = {}
    for row in connection.execute(
        sa.text(
            "SELECT i.index_id, i.name, i.type, i.is_unique, i.has_filter, i.filter_definition, "
            "CAST(INDEXPROPERTY(i.object_id, i.name, 'IsClustered') AS int) "
            "FROM sys.indexes AS i WHERE i.object_id = :o AND i.type > 0"
        ),
        {"o": object_id},
    ):
        parts = list(
            connection.execute(
                sa.text(
                    "SELECT c.name, ic.key_ordinal, ic.is_included_column FROM sys.index_columns "
                    "AS ic JOIN sys.columns AS c ON c.object_id = ic.object_id "
                    "AND c.column_id = ic.column_id WHERE ic.object_id = :o AND ic.index_id = :i "
                    "ORDER BY ic.key_ordinal, c.name"
                ),
                {"o": object_id, "i": row[0]},
            )
        )
        indexes[row[1]] = {
            "type": row[2],
            "unique": bool(row[3]),
            "keys": [part[0] for part in parts if not part[2]],
            "include": sorted(part[0] for part in parts if part[2]),
            "where": _normalized(row[5]) if row[4] else None,
        }
    return {"columns": columns, "indexes": indexes}


def without_column(shape: dict[str, Any], column: str) -> dict[str, Any]:
    """*shape* minus *column* (for tables whose Recoverable was dropped)."""
    return {**shape, "columns": [c for c in shape["columns"] if c[0] != column]}


#: A legacy CorrelationId that held values, as revision 0008 keeps it on PostgreSQL.
KEPT_CORRELATION_ID = ("correlationid", "character varying(255)", False, "", None, None)


def with_kept_correlation_id(shape: dict[str, Any]) -> dict[str, Any]:
    """*shape* (a fresh NServiceBus PostgreSQL table) plus the kept ``correlationid``."""
    columns = list(shape["columns"])
    return {**shape, "columns": [columns[0], KEPT_CORRELATION_ID, *columns[1:]]}


def columns_in_any_order(shape: dict[str, Any], *, drop: str | None = None) -> dict[str, Any]:
    """*shape* with its columns sorted (a downgrade adds columns back at the end)."""
    return {**shape, "columns": sorted(c for c in shape["columns"] if c[0] != drop)}
