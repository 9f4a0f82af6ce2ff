"""How the PL/pgSQL blocks are written: blocks, ``IF``, the target table, catalog reads.

A :class:`Target` renders statements for one named table, or for the loop's current table; the
helpers read a table's indexes and columns from ``pg_index`` / ``pg_attribute`` into the block's
variables, so each step can look before it acts. A step's body is a :class:`Plan`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from sqlqueue_orm import addressing, dialects
from sqlqueue_orm.migration import impl, steps

_INDENT = "    "
_MAX_IDENTIFIER = dialects.postgresql.IDENTIFIER_LIMIT
_DIGEST = 8

Lines = list[str]


def dialect() -> Dialect:
    """A PostgreSQL dialect for rendering (named paramstyle: no %-doubling)."""
    return postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]


def comment(text: str) -> str:
    """*text* made safe for a ``--`` comment line (names may hold line breaks)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def indented(lines: Iterable[str], depth: int = 1) -> Lines:
    """*lines* indented *depth* levels (blank lines stay blank)."""
    return [(_INDENT * depth + line) if line else line for line in lines]


def if_block(condition: str, then: Lines) -> Lines:
    """``IF`` *condition* ``THEN`` *then* ``END IF;``."""
    return [f"IF {condition} THEN", *indented(then), "END IF;"]


class Target:
    """Renders statements for one named table, or for the loop's current table.

    :param implementation: the PostgreSQL implementation, whose index variants it creates.
    """

    def __init__(
        self,
        implementation: impl.QueueTableImpl,
        dialect: Dialect,
        address: addressing.QueueAddress | None,
    ) -> None:
        self.implementation = implementation
        self.dialect = dialect
        self.looping = address is None
        if address is None:
            address = addressing.QueueAddress(steps.PLACEHOLDER_TABLE, steps.PLACEHOLDER_SCHEMA)
        self.address = address
        self.table = steps.model_table(address)
        self.quoted = dialect.identifier_preparer.format_table(self.table)

    def literal(self, text: str) -> str:
        """*text* as a string literal."""
        literal = sa.literal(text, sa.String())
        return str(literal.compile(dialect=self.dialect, compile_kwargs={"literal_binds": True}))

    def quote(self, name: str) -> str:
        """*name* quoted as an identifier."""
        return str(self.dialect.identifier_preparer.quote_identifier(name))

    def array(self, names: Sequence[str]) -> str:
        """A ``text[]`` of *names*."""
        if not names:
            return "'{}'::text[]"
        return "ARRAY[" + ", ".join(self.literal(name) for name in names) + "]::text[]"

    def index(self, base: str) -> sa.Index:
        """The model index *base* of this target's table."""
        return steps.model_index(self.table, base, "postgresql")

    def create(self, index: sa.Index, *, where: bool = True) -> str:
        """``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` of a variant of model *index*."""
        copy = self.implementation.variant(index, where=where, concurrently=True)
        return steps.compile_ddl(sa.schema.CreateIndex(copy, if_not_exists=True), self.dialect)

    def create_format(self, index: sa.Index, *, where: bool = True) -> str:
        """A ``format()`` string creating *index*: ``%1$I`` its name, ``%2$s`` the table."""
        copy = self.implementation.variant(index, where=where)
        sql = steps.compile_ddl(sa.schema.CreateIndex(copy), self.dialect).replace("%", "%%")
        sql = sql.replace(self.quote(str(index.name)), "%1$I", 1)
        return sql.replace(self.quoted, "%2$s")

    def drop(self, index: sa.Index) -> str:
        """``DROP INDEX CONCURRENTLY IF EXISTS`` of *index*."""
        copy = self.implementation.variant(index, concurrently=True)
        return steps.compile_ddl(sa.schema.DropIndex(copy, if_exists=True), self.dialect)


def signature_count(
    target: Target, relation: str, signature: Sequence[str] = steps.SIGNATURE
) -> str:
    """How many of the columns *signature* the table *relation* (an oid) has."""
    names = ", ".join(target.literal(name) for name in signature)
    return (
        f"(SELECT count(*) FROM pg_attribute AS a WHERE a.attrelid = {relation} "
        f"AND a.attnum > 0 AND NOT a.attisdropped AND a.attname IN ({names}))"
    )


def compute_index_name(target: Target, variable: str, base: str) -> Lines:
    """Compute in *variable* the name of index *base* of table ``rel``.

    The name :func:`~sqlqueue_orm.models.queue_table.index_name` gives it.
    """
    suffix = target.literal(f"_{base}")
    room = _MAX_IDENTIFIER - len(base) - _DIGEST - 2
    return [
        f"{variable} := rel || {suffix};",
        *if_block(
            f"octet_length({variable}) > {_MAX_IDENTIFIER}",
            [
                "head := rel;",
                f"WHILE octet_length(head) > {room} LOOP",
                "    head := left(head, -1);",
                "END LOOP;",
                f"{variable} := head || '_' || left(md5(rel), {_DIGEST}) || {suffix};",
            ],
        ),
    ]


def index_state() -> Lines:
    """Read index ``ix`` of ``tbl`` into present/valid/uniq/method/keys/includes/predicate."""
    return [
        "SELECT i.indisvalid AND i.indisready, i.indisunique, am.amname,",
        "       ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true)",
        "             FROM generate_series(1, i.indnkeyatts) AS k ORDER BY k),",
        "       ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true)",
        "             FROM generate_series(i.indnkeyatts + 1, i.indnatts) AS k ORDER BY k),",
        "       pg_get_expr(i.indpred, i.indrelid)",
        "  INTO valid, uniq, method, keys, includes, predicate",
        "  FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid",
        "  JOIN pg_am AS am ON am.oid = ic.relam",
        " WHERE i.indrelid = tbl AND ic.relname = ix;",
        "present := FOUND;",
    ]


def adopt_index(target: Target, column: str) -> Lines:
    """Rename an index on exactly (*column*) that has another name to ``ix``."""
    return if_block(
        "NOT present",
        [
            "SELECT ic.relname INTO other",
            "  FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid",
            " WHERE i.indrelid = tbl AND NOT i.indisunique AND i.indisvalid",
            "   AND i.indnkeyatts = 1 AND i.indexprs IS NULL",
            "   AND pg_get_indexdef(i.indexrelid, 1, true) = "
            + target.literal(target.quote(column)),
            " ORDER BY ic.relname LIMIT 1;",
            *if_block(
                "other IS NOT NULL",
                [
                    "EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', nsp, other, ix);",
                    "RAISE NOTICE 'queue %: renamed index % to %', tbl, other, ix;",
                    *index_state(),
                ],
            ),
        ],
    )


def drop_unless(condition: str) -> Lines:
    """Drop index ``ix`` if it is present and *condition* does not hold of it."""
    return if_block(
        f"present AND NOT ({condition})",
        [
            "EXECUTE format('DROP INDEX %I.%I', nsp, ix);",
            "RAISE NOTICE 'queue %: dropped index % to build it anew', tbl, ix;",
            "present := false;",
        ],
    )


class Plan:
    """One step on one table: a DO-block body, then maybe an index to create or drop."""

    def __init__(
        self,
        body: Lines,
        names: dict[str, str],
        create: tuple[sa.Index, bool] | None = None,
        drop: sa.Index | None = None,
    ) -> None:
        self.body = body
        #: variable -> index base name it holds
        self.names = names
        self.create = create
        self.drop = drop


def column_state(target: Target, column: str) -> Lines:
    """Read *column* of ``tbl`` into typ/not_null/ident/dflt."""
    return [
        "SELECT format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity::text,",
        "       pg_get_expr(d.adbin, d.adrelid)",
        "  INTO typ, not_null, ident, dflt",
        "  FROM pg_attribute AS a",
        "  LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum",
        f" WHERE a.attrelid = tbl AND a.attname = {target.literal(column)} AND NOT a.attisdropped;",
    ]


def execute(target: Target, sql: str, *arguments: str) -> str:
    """``EXECUTE format(`` *sql* ``,`` *arguments* ``);``."""
    return f"EXECUTE format({target.literal(sql)}, {', '.join(arguments)});"


def has_column(target: Target, name: str) -> str:
    """The table ``tbl`` has a column *name*."""
    return (
        "EXISTS (SELECT 1 FROM pg_attribute AS a WHERE a.attrelid = tbl AND a.attnum > 0 "
        f"AND NOT a.attisdropped AND a.attname = {target.literal(name)})"
    )
