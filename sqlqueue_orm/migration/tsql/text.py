"""How the T-SQL batches are written: blocks, ``IF``, the target table, catalog conditions.

A :class:`Target` renders statements for one named table, or for the looping batch's current
table ``@table`` (run through ``sp_executesql``); the conditions read ``sys.indexes`` /
``sys.index_columns`` / ``sys.columns`` so each batch is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.engine import Dialect

from sqlqueue_orm import addressing
from sqlqueue_orm.migration import impl, steps

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


def indented(lines: Iterable[str], depth: int = 1) -> Lines:
    """*lines* indented *depth* levels (blank lines stay blank)."""
    return [(_INDENT * depth + line) if line else line for line in lines]


def if_block(condition: str, then: Lines, otherwise: Lines | None = None) -> Lines:
    """``IF`` *condition* ``BEGIN`` *then* ``END``, with an ``ELSE`` block of *otherwise*."""
    out = [f"IF {condition}", "BEGIN", *indented(then), "END"]
    if otherwise is not None:
        out += ["ELSE", "BEGIN", *indented(otherwise), "END"]
    return out


class Target:
    """Renders statements for one named table, or for the loop's current table ``@table``.

    :param implementation: the SQL Server implementation, whose index variants it creates.
    """

    def __init__(
        self,
        implementation: impl.QueueTableImpl,
        dialect: Dialect,
        address: addressing.QueueAddress | None,
        cluster_heaps: bool = False,
    ) -> None:
        self.implementation = implementation
        self.dialect = dialect
        self.cluster_heaps = cluster_heaps
        self.looping = address is None
        if address is None:
            address = addressing.QueueAddress(steps.PLACEHOLDER_TABLE, steps.PLACEHOLDER_SCHEMA)
        self.table = steps.model_table(address)
        self.quoted = dialect.identifier_preparer.format_table(self.table)

    def literal(self, text: str) -> str:
        """*text* as an ``N'...'`` literal."""
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
        """The model index *base* of this target's table."""
        return steps.model_index(self.table, base, "mssql")

    def create(self, index: sa.Index, **kw: Any) -> str:
        """``CREATE INDEX`` of a variant of model *index* (see :class:`impl.IndexVariant`)."""
        return steps.compile_ddl(
            sa.schema.CreateIndex(self.implementation.variant(index, **kw)),
            self.dialect,
        )

    def drop(self, index: sa.Index) -> str:
        """``DROP INDEX`` of *index*."""
        return steps.compile_ddl(sa.schema.DropIndex(index), self.dialect)

    def quote(self, name: str) -> str:
        """*name* quoted as an identifier."""
        return str(self.dialect.identifier_preparer.quote_identifier(name))


def in_list(target: Target, names: Sequence[str]) -> str:
    """``(N'a', N'b', ...)`` of *names*."""
    return "(" + ", ".join(target.literal(name) for name in names) + ")"


def signature_count(target: Target, object_id: str) -> str:
    """How many of the queue table's signature columns the table *object_id* has."""
    return (
        f"(SELECT COUNT(*) FROM sys.columns WHERE object_id = {object_id} "
        f"AND name IN {in_list(target, steps.SIGNATURE)})"
    )


def index_exists(target: Target, name: str, extra: str = "") -> str:
    """The table ``@object_id`` has an index ``i`` named *name* (and *extra* holds of it)."""
    return (
        "EXISTS (SELECT 1 FROM sys.indexes AS i WHERE i.object_id = @object_id "
        f"AND i.name = {target.literal(name)}{extra})"
    )


def key_is(target: Target, column: str) -> str:
    """The index ``i`` has exactly one key column, *column*."""
    return (
        "EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.key_ordinal = 1 "
        f"AND c.name = {target.literal(column)}) "
        "AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic WHERE ic.object_id = i.object_id "
        "AND ic.index_id = i.index_id AND ic.key_ordinal > 1)"
    )


def includes_columns(target: Target, columns: Sequence[str]) -> str:
    """The index ``i`` INCLUDEs every one of *columns*."""
    return (
        "(SELECT COUNT(*) FROM sys.index_columns AS ic JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE ic.object_id = i.object_id AND ic.index_id = i.index_id "
        f"AND ic.is_included_column = 1 AND c.name IN {in_list(target, columns)}) = {len(columns)}"
    )


def with_online(target: Target, build: Callable[[dict[str, str]], str], **options: str) -> Lines:
    """``IF @online = 1`` the statement WITH (..., ONLINE = ON), else without ONLINE."""
    online = target.statement(build({**options, "ONLINE": "ON"}))
    offline = target.statement(build(options))
    return if_block("@online = 1", online, offline)


def adopt_index(target: Target, name: str, column: str, types: str) -> Lines:
    """Rename an index on exactly (*column*) that has another name to *name* (sp_rename)."""
    find = [
        "SET @index = NULL;",
        "SELECT TOP (1) @index = i.name FROM sys.indexes AS i",
        f"WHERE i.object_id = @object_id AND i.type IN ({types}) AND i.is_unique = 0 "
        "AND i.is_hypothetical = 0",
        f"    AND {key_is(target, column)}",
        "ORDER BY i.type, i.index_id;",
    ]
    rename = [
        f"SET @sql = {target.name} + N'.' + QUOTENAME(@index);",
        f"EXEC sp_rename @objname = @sql, @newname = {target.literal(name)}, @objtype = N'INDEX';",
        f"PRINT N'queue ' + {target.name} + N': renamed index ' + QUOTENAME(@index) "
        f"+ N' to ' + {target.literal(target.quote(name))};",
    ]
    return if_block(
        f"NOT {index_exists(target, name)}", [*find, *if_block("@index IS NOT NULL", rename)]
    )
