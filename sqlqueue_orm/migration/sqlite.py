"""SQLite implementation of the queue table steps (online only: SQLite has no server-side loop).

Indexes are created and dropped in place (SQLite cannot rename an index, so a differently named
one is dropped and the right one built). A declared column type or AUTOINCREMENT can only change
by rebuilding the table, SQLite's documented "12 steps": create the new table, copy every row
with its RowVersion (so FIFO order survives), drop the old table, rename the new one, then put
back the indexes and triggers from their saved SQL and the ``sqlite_sequence`` value (so new
RowVersions keep growing past every one ever handed out). The rebuild runs in the migration's
transaction, which holds SQLite's write lock: writers wait (busy timeout) until it commits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import quoted_name

from sqlqueue_orm import addressing, exceptions, schema
from sqlqueue_orm.migration import impl, steps
from sqlqueue_orm.models.queue_table import index_name

if TYPE_CHECKING:
    from alembic.runtime.migration import MigrationContext

log = logging.getLogger(__name__)

_TEXT_AFFINITY = ("CHAR", "CLOB", "TEXT")
_CREATE_INDEX = re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?", re.I)
_CREATE_TRIGGER = re.compile(
    r"^\s*CREATE\s+(?:TEMP\s+|TEMPORARY\s+)?TRIGGER\s+(?:IF\s+NOT\s+EXISTS\s+)?", re.I
)
_UNSUPPORTED = re.compile(r"\b(CHECK|REFERENCES|COLLATE|UNIQUE|WITHOUT\s+ROWID|STRICT)\b", re.I)


class _Declared(sa.types.UserDefinedType[Any]):
    """A column type rendered exactly as it was declared."""

    cache_ok = True

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def get_col_spec(self, **kw: Any) -> str:
        return self.spec


def blank_quoted(sql: str) -> str:
    """*sql* with the inside of every quoted name or string blanked (same length)."""
    out: list[str] = []
    i = 0
    while i < len(sql):
        char = sql[i]
        if char not in "\"'`[":
            out.append(char)
            i += 1
            continue
        close = "]" if char == "[" else char
        j = i + 1
        while j < len(sql):
            if sql[j] == close:
                if close != "]" and sql[j + 1 : j + 2] == close:
                    j += 2
                    continue
                break
            j += 1
        out.append(char + " " * (min(j, len(sql)) - i - 1) + (close if j < len(sql) else ""))
        i = j + 1
    return "".join(out)


def where_clause(sql: str | None) -> str | None:
    """The ``WHERE`` predicate of a ``CREATE INDEX`` statement, or None."""
    if not sql:
        return None
    match = re.search(r"\bWHERE\b", blank_quoted(sql), re.I)
    return sql[match.end() :].strip() if match else None


def normalized(predicate: str | None) -> str | None:
    """A predicate without quotes, brackets, parentheses, spaces or case, for comparing."""
    if predicate is None:
        return None
    return re.sub(r"[\s\"'`\[\]()]", "", predicate).lower()


@dataclasses.dataclass(frozen=True)
class Column:
    """One column as ``pragma_table_xinfo`` tells it."""

    name: str
    type: str
    notnull: bool
    default: str | None
    pk: int
    hidden: int


@dataclasses.dataclass(frozen=True)
class Index:
    """One index as ``pragma_index_list`` / ``pragma_index_xinfo`` / ``sqlite_master`` tell it."""

    name: str
    unique: bool
    origin: str
    keys: tuple[str, ...]
    where: str | None
    sql: str | None


class Table:
    """A queue table in a SQLite database (``schema`` = an ATTACHed database), inspected live."""

    def __init__(self, connection: Connection, address: addressing.QueueAddress) -> None:
        self.connection = connection
        self.address = address
        self.name = address.table
        self.schema = address.schema or "main"
        preparer = connection.dialect.identifier_preparer
        self.quoted_schema = preparer.quote_identifier(self.schema)
        self.quoted = preparer.format_table(self.sa_table())

    def sa_table(self, name: str | None = None, *columns: sa.ColumnClause[Any]) -> sa.TableClause:
        """A lightweight Core table of this table (or of *name* in its schema)."""
        schema_name = None if self.address.schema is None else quoted_name(self.schema, True)
        return sa.table(quoted_name(name or self.name, True), *columns, schema=schema_name)

    def _rows(self, sql: str, **params: Any) -> list[Any]:
        return list(self.connection.execute(sa.text(sql), params))

    def columns(self) -> list[Column]:
        """The columns, in order, hidden (generated) ones included."""
        rows = self._rows(
            'SELECT name, type, "notnull", dflt_value, pk, hidden '
            "FROM pragma_table_xinfo(:table, :schema) ORDER BY cid",
            table=self.name,
            schema=self.schema,
        )
        return [
            Column(str(r[0]), str(r[1] or ""), bool(r[2]), r[3], int(r[4]), int(r[5])) for r in rows
        ]

    def _master_sql(self, kind: str, name: str) -> str | None:
        row = self.connection.execute(
            sa.text(
                f"SELECT sql FROM {self.quoted_schema}.sqlite_master "
                "WHERE type = :kind AND name = :name"
            ),
            {"kind": kind, "name": name},
        ).first()
        return None if row is None else row[0]

    def indexes(self) -> dict[str, Index]:
        """The indexes by name (``sqlite_autoindex_*`` of constraints included)."""
        found = {}
        for row in self._rows(
            'SELECT name, "unique", origin FROM pragma_index_list(:table, :schema)',
            table=self.name,
            schema=self.schema,
        ):
            name = str(row[0])
            keys = tuple(
                str(key[0])
                for key in self._rows(
                    "SELECT name FROM pragma_index_xinfo(:index, :schema) WHERE key = 1 "
                    "ORDER BY seqno",
                    index=name,
                    schema=self.schema,
                )
            )
            sql = self._master_sql("index", name)
            found[name] = Index(name, bool(row[1]), str(row[2]), keys, where_clause(sql), sql)
        return found

    def table_sql(self) -> str:
        """The table's CREATE TABLE statement as SQLite keeps it."""
        return self._master_sql("table", self.name) or ""

    def autoincrement(self) -> bool:
        """Whether the table was declared with AUTOINCREMENT."""
        return re.search(r"\bAUTOINCREMENT\b", blank_quoted(self.table_sql()), re.I) is not None

    def count(self) -> int:
        """The number of rows."""
        return int(
            self.connection.execute(sa.text(f"SELECT count(*) FROM {self.quoted}")).scalar_one()
        )

    def execute(self, sql: str) -> None:
        """Run finished SQL (names in it quoted by SQLAlchemy)."""
        self.connection.exec_driver_sql(sql)

    def model_index(self, base: str) -> sa.Index:
        """The current model's index *base* for this table."""
        return steps.model_index(steps.model_table(self.address), base, "sqlite")

    def create_index(self, index: sa.Index, *, where: bool = True) -> None:
        """Create model *index* (``where=False``: without its filter)."""
        copy = _IMPL.variant(index, where=where)
        self.connection.execute(sa.schema.CreateIndex(copy))

    def drop_index(self, name: str) -> None:
        """Drop index *name* of this table's schema."""
        self.execute(f"DROP INDEX {self.quoted_schema}.{self._quote(name)}")

    def _quote(self, name: str) -> str:
        return str(self.connection.dialect.identifier_preparer.quote_identifier(name))

    def _in_schema(self, sql: str, pattern: re.Pattern[str]) -> str:
        """Saved CREATE INDEX/TRIGGER *sql* (stored without schema) aimed at this schema."""
        if self.address.schema is None:
            return sql
        match = pattern.search(blank_quoted(sql))
        if match is None:
            raise exceptions.ConfigurationError(
                f"queue {self.address}: cannot re-create {sql!r} after rebuilding the table"
            )
        return sql[: match.end()] + f"{self.quoted_schema}." + sql[match.end() :]

    def rebuild(
        self, *, headers_type: str | None = None, autoincrement: bool | None = None
    ) -> None:
        """Rebuild the table with another Headers type and/or AUTOINCREMENT, keeping all else."""
        columns = self.columns()
        self._check_rebuildable(columns)
        keep_auto = self.autoincrement() if autoincrement is None else autoincrement
        plain = [column for column in columns if not column.hidden]
        primary = sorted((column for column in plain if column.pk), key=lambda column: column.pk)
        row_version_key = [column.name for column in primary] == ["RowVersion"]
        if keep_auto and not row_version_key:
            raise exceptions.ConfigurationError(
                f"queue {self.address}: RowVersion is not the table's only primary key column; "
                "migrate it by hand"
            )
        temporary = f"{self.name}__sqlqueue_rebuild"
        new_table = self._new_table(
            temporary, plain, headers_type, row_version_key, autoincrement=keep_auto
        )
        saved = self._saved_sql()
        sequence = self._sequence() if self.autoincrement() else 0
        names = [column.name for column in plain]
        old = self.sa_table(None, *(sa.column(name) for name in names))
        top = self.connection.execute(sa.select(sa.func.max(old.c.RowVersion))).scalar()
        assert new_table.metadata is not None
        new_table.metadata.create_all(self.connection)
        # Every row with its RowVersion, in order: FIFO survives.
        copy = sa.insert(new_table).from_select(
            names, sa.select(*(old.c[name] for name in names)).order_by(old.c.RowVersion)
        )
        self.connection.execute(copy)
        self.execute(f"DROP TABLE {self.quoted}")
        self._rename_from(temporary)
        if keep_auto:
            self._set_sequence(max(sequence, int(top or 0)))
        for sql in saved:
            self.execute(sql)
        if any(column.name == "BodyString" for column in columns if column.hidden):
            self.execute(schema.body_string_statement(self.connection.dialect, self.address))

    def _check_rebuildable(self, columns: list[Column]) -> None:
        """Refuse a table with parts the rebuild would not keep (naming them)."""
        problems = set(
            match.group(1).upper()
            for match in _UNSUPPORTED.finditer(blank_quoted(self.table_sql()))
        )
        problems |= {
            f"generated column {c.name!r}"
            for c in columns
            if c.hidden and (c.name, c.hidden) != ("BodyString", 2)
        }
        if any(index.origin == "u" for index in self.indexes().values()):
            problems.add("UNIQUE")
        if problems:
            raise exceptions.ConfigurationError(
                f"queue {self.address}: the table has {', '.join(sorted(problems))}, which the "
                "SQLite table rebuild would not keep; migrate it by hand"
            )

    def _new_table(
        self,
        temporary: str,
        plain: list[Column],
        headers_type: str | None,
        row_version_key: bool,
        *,
        autoincrement: bool,
    ) -> sa.Table:
        """The rebuilt table, named *temporary*: every column as declared, but Headers."""
        new_columns = []
        for column in plain:
            type_: sa.types.TypeEngine[Any] = _Declared(column.type)
            notnull = column.notnull
            if column.name == "Headers" and headers_type is not None:
                type_, notnull = _Declared(headers_type), True
            if column.name == "RowVersion" and row_version_key and column.type.upper() == "INTEGER":
                type_ = sa.Integer()
            default = None if column.default is None else sa.text(str(column.default))
            new_columns.append(
                sa.Column(
                    column.name,
                    type_,
                    primary_key=bool(column.pk),
                    nullable=not notnull,
                    server_default=default,
                    autoincrement=False,
                )
            )
        return sa.Table(
            quoted_name(temporary, True),
            sa.MetaData(),
            *new_columns,
            schema=None if self.address.schema is None else quoted_name(self.schema, True),
            sqlite_autoincrement=autoincrement,
        )

    def _saved_sql(self) -> list[str]:
        """The table's indexes and triggers as SQLite keeps them, to put back after a rebuild."""
        return [
            self._in_schema(str(row[1]), _CREATE_INDEX if row[0] == "index" else _CREATE_TRIGGER)
            for row in self._rows(
                f"SELECT type, sql FROM {self.quoted_schema}.sqlite_master "
                "WHERE tbl_name = :table AND type IN ('index', 'trigger') AND sql IS NOT NULL "
                "ORDER BY type, name",
                table=self.name,
            )
        ]

    def _sequence(self) -> int:
        """The last RowVersion AUTOINCREMENT handed out (``sqlite_sequence``)."""
        return int(
            self.connection.execute(
                sa.text(
                    f"SELECT coalesce(max(seq), 0) FROM {self.quoted_schema}.sqlite_sequence "
                    "WHERE name = :table"
                ),
                {"table": self.name},
            ).scalar_one()
        )

    def _set_sequence(self, value: int) -> None:
        """Make new RowVersions go on past *value*."""
        self.connection.execute(
            sa.text(f"DELETE FROM {self.quoted_schema}.sqlite_sequence WHERE name = :table"),
            {"table": self.name},
        )
        self.connection.execute(
            sa.text(
                f"INSERT INTO {self.quoted_schema}.sqlite_sequence (name, seq) "
                "VALUES (:table, :seq)"
            ),
            {"table": self.name, "seq": value},
        )

    def _rename_from(self, temporary: str) -> None:
        """Give table *temporary* this table's name."""
        # legacy_alter_table: the rename leaves views and triggers elsewhere as they are (they
        # name the final table already).
        self.execute("PRAGMA legacy_alter_table = ON")
        try:
            self.execute(
                f"ALTER TABLE {self.quoted_schema}.{self._quote(temporary)} "
                f"RENAME TO {self._quote(self.name)}"
            )
        finally:
            self.execute("PRAGMA legacy_alter_table = OFF")


# -- the steps ---------------------------------------------------------------------------------
def _expires_name(table: Table) -> str:
    return index_name(table.name, steps.EXPIRES_INDEX, "sqlite")


def upgrade_expires_index(table: Table) -> list[str]:
    """0001 up: Index_Expires on (Expires), built anew if it differs from the model."""
    name = _expires_name(table)
    index = table.model_index(steps.EXPIRES_INDEX)
    indexes = table.indexes()
    done = []
    current = indexes.get(name)
    if current is None:
        other = next(
            (
                found
                for found in indexes.values()
                if found.keys == ("Expires",) and not found.unique and found.origin == "c"
            ),
            None,
        )
        if other is not None:
            table.drop_index(other.name)
            done.append(f"dropped index {other.name!r} (SQLite cannot rename it)")
    elif current.keys != ("Expires",) or current.unique:
        table.drop_index(name)
        done.append(f"dropped index {name!r} (not on Expires alone)")
        current = None
    if current is None:
        table.create_index(index)
        done.append(f"created index {name!r}")
    return done


def downgrade_expires_index(table: Table) -> list[str]:
    """0001 down: drop Index_Expires."""
    name = _expires_name(table)
    if name in table.indexes():
        table.drop_index(name)
        return [f"dropped index {name!r}"]
    return []


def _filter(table: Table, filtered: bool) -> list[str]:
    name = _expires_name(table)
    index = table.model_index(steps.EXPIRES_INDEX)
    wanted = None
    if filtered:
        wanted = normalized(steps.index_filter(index, table.connection.dialect))
    current = table.indexes().get(name)
    if current is not None and normalized(current.where) == wanted:
        return []
    done = []
    if current is not None:
        table.drop_index(name)
        done.append(f"dropped index {name!r}")
    table.create_index(index, where=filtered)
    done.append(f"created index {name!r} {'with' if filtered else 'without'} WHERE")
    return done


def upgrade_filter_expires_index(table: Table) -> list[str]:
    """0003 up: Index_Expires filtered to rows with an Expires."""
    return _filter(table, True)


def downgrade_filter_expires_index(table: Table) -> list[str]:
    """0003 down: Index_Expires unfiltered again."""
    return _filter(table, False)


def _headers_column(table: Table) -> Column:
    for column in table.columns():
        if column.name == "Headers":
            return column
    raise exceptions.ConfigurationError(f"queue {table.address}: no Headers column")


def upgrade_headers_nvarchar(table: Table) -> list[str]:
    """0002 up: Headers of the model's text type, NOT NULL (the table rebuilt)."""
    model = steps.model_table(table.address).c.Headers
    wanted = str(model.type.compile(dialect=table.connection.dialect))
    column = _headers_column(table)
    if column.type.upper() == wanted.upper() and column.notnull:
        return []
    if not any(marker in column.type.upper() for marker in _TEXT_AFFINITY):
        raise exceptions.ConfigurationError(
            f"queue {table.address}: column Headers is {column.type!r}, not text; "
            "convert it by hand"
        )
    table.rebuild(headers_type=wanted)
    return [f"rebuilt the table: Headers {column.type} -> {wanted} NOT NULL"]


def downgrade_headers_nvarchar(table: Table) -> list[str]:
    """0002 down: Headers back to VARCHAR (the table rebuilt)."""
    column = _headers_column(table)
    if column.type.upper() != "TEXT":
        return []
    table.rebuild(headers_type="VARCHAR")
    return ["rebuilt the table: Headers TEXT -> VARCHAR"]


def _row_version_index_names(table: Table) -> list[str]:
    return [
        index.name
        for index in table.indexes().values()
        if index.keys == ("RowVersion",) and index.origin == "c"
    ]


def upgrade_rowversion_layout(table: Table) -> list[str]:
    """0004 up: RowVersion INTEGER PRIMARY KEY AUTOINCREMENT, no index on it."""
    done = []
    row_version = next((c for c in table.columns() if c.name == "RowVersion"), None)
    primary = [column.name for column in table.columns() if column.pk]
    alias = (
        row_version is not None
        and row_version.type.upper() == "INTEGER"
        and primary == ["RowVersion"]
    )
    if not (alias and table.autoincrement()):
        table.rebuild(autoincrement=True)
        done.append("rebuilt the table: RowVersion INTEGER PRIMARY KEY AUTOINCREMENT")
    # RowVersion is the rowid, the table's own order: an index on it is dead weight.
    for name in _row_version_index_names(table):
        table.drop_index(name)
        done.append(f"dropped index {name!r} (RowVersion is the rowid)")
    return done


def downgrade_rowversion_layout(table: Table) -> list[str]:
    """0004 down: RowVersion INTEGER PRIMARY KEY without AUTOINCREMENT."""
    if not table.autoincrement():
        return []
    table.rebuild(autoincrement=False)
    return ["rebuilt the table: RowVersion INTEGER PRIMARY KEY without AUTOINCREMENT"]


class SqliteImpl(impl.QueueTableImpl):
    """SQLite: the steps inspect and change the table live, in the migration's transaction."""

    __dialect__ = "sqlite"
    transactional_ddl = True

    # The step bodies are this module's functions (upgrade_expires_index, ...); each returns
    # what it did.
    bodies = sys.modules[__name__]

    # -- the interface -------------------------------------------------------------------------
    def index_options(self, options: Any, variant: impl.IndexVariant) -> dict[str, Any]:
        """``sqlite_where`` of an index variant."""
        return {"sqlite_where": options["where"] if variant.where else None}

    def apply(
        self,
        connection: Connection,
        revision: str,
        direction: str,
        address: addressing.QueueAddress,
        *,
        quiet: bool = False,
    ) -> bool:
        """Apply the step in the caller's transaction; whether it did anything.

        The progress line comes after the step, saying what it did (with the row count before).
        """
        step = steps.step(revision, direction)
        table = Table(connection, address)
        rows = None if quiet else table.count()
        done: list[str] = self.body(revision, direction)(table)
        if rows is not None:
            log.info(
                "queue %s: %s (%d rows): %s",
                address,
                step.describe(direction),
                rows,
                "; ".join(done) or "nothing to do",
            )
        return bool(done)

    def upgrade_table(
        self, connection: Connection, address: addressing.QueueAddress, revisions: Sequence[str]
    ) -> Iterator[tuple[str, bool]]:
        """Each step in turn, saying whether it did anything."""
        for revision in revisions:
            yield revision, self.apply(connection, revision, "upgrade", address, quiet=True)

    @contextlib.contextmanager
    def steps_connection(self, context: MigrationContext) -> Iterator[Connection]:
        """The migration's own connection, in its transaction: a revision commits whole."""
        assert context.connection is not None
        yield context.connection

    @contextlib.contextmanager
    def table_transaction(self, context: MigrationContext) -> Iterator[Connection]:
        """One transaction per table: it is upgraded whole or not at all."""
        connection = context.connection
        assert connection is not None
        with connection.begin():
            yield connection


_IMPL = SqliteImpl()
