"""Schema verification: every table this package owns, compared with the layout of its dialect.

:func:`verify` finds the queue tables on the server (by their column signature, tolerating one
missing column so that a dropped column is reported rather than hiding the table), the delayed
tables, the subscription table and the outbox tables, and compares each with the table this
version would create for the dialect:

* columns: present, type (both compiled by the dialect's type compiler), nullability; where the
  database enforces no text length (SQLite) two declared lengths are one type, and SQLite's
  ``INTEGER PRIMARY KEY`` (the rowid) is never NULL whatever it declares: what the migration
  leaves as it is, verify accepts;
* primary key and unique constraints (PostgreSQL, SQL Server);
* indexes: present, key columns, ``INCLUDE`` columns, clustered or not (SQL Server), and the
  partial-index predicate, read from the catalog (``pg_index.indpred`` through ``pg_get_expr``,
  ``sys.indexes.filter_definition``, SQLite's ``sqlite_master.sql``) and normalised, because
  Alembic's autogenerate does not compare ``postgresql_where``;
* PostgreSQL: storage settings (``fillfactor``, per-table autovacuum thresholds, read from
  ``pg_class.reloptions``) and the ``NOTIFY`` wake-up trigger, where it exists and on the
  queues named as expected to have it.

Each difference is a :class:`Drift` carrying the statements that repair it, built with
SQLAlchemy (and Alembic's DDL elements), so every name is quoted by the dialect. On SQLite,
which cannot alter a column, a column drift is repaired by rebuilding the table (create, copy,
drop, rename, re-index) in the repair's statements. Nothing here changes the database:
``sqlqueue verify`` prints the repairs and a DBA runs them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic.ddl import base as alembic_ddl
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import quoted_name

from sqlqueue_orm import addressing, dialects, exceptions, models, schema, sqlalchemy_internals
from sqlqueue_orm.models import ddl
from sqlqueue_orm.models.delayed_table import build_delayed_table
from sqlqueue_orm.models.queue_table import SQL_SERVER_LAYOUTS, build_queue_table
from sqlqueue_orm.models.subscription import TABLE_NAME as SUBSCRIPTION_TABLE
from sqlqueue_orm.models.subscription import subscription_table

log = logging.getLogger(__name__)

#: Suffix of the table a SQLite rebuild creates, copies into, and renames.
REBUILD_SUFFIX = "__sqlqueue_rebuild"


@dataclasses.dataclass(frozen=True)
class Drift:
    """One difference between a table on the server and the layout expected for its dialect."""

    #: The table, as a queue address is written (``orders``, ``orders@[sales]``).
    table: str
    #: What differs: ``column``, ``type``, ``nullability``, ``constraint``, ``index``,
    #: ``storage``, ``trigger``.
    kind: str
    #: The column, index, constraint or trigger concerned.
    subject: str
    #: What the server has (``"missing"`` when absent).
    found: str
    #: What the layout expects.
    expected: str
    #: The statements that repair it, in order (run them in one transaction).
    repair: tuple[str, ...]

    def describe(self) -> str:
        """One line: table, kind, subject, found and expected."""
        return (
            f"table {self.table}: {self.kind} {self.subject}: found {self.found}, "
            f"expected {self.expected}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The drift as a JSON-ready dictionary."""
        return {**dataclasses.asdict(self), "repair": list(self.repair)}


def repair_script(drifts: Iterable[Drift]) -> list[str]:
    """The repair statements of *drifts*, each once, in order (a rebuild repairs several)."""
    return list(dict.fromkeys(statement for drift in drifts for statement in drift.repair))


def _normalised(text: str | None, support: dialects.DialectSupport) -> str:
    """SQL text compared loosely: no quotes, brackets, parentheses, casts or spaces; lower case.

    The casts removed are those *support*'s catalog adds (:attr:`~.DialectSupport.catalog_casts`).
    """
    if text is None:
        return ""
    if support.catalog_casts is not None:
        text = re.sub(support.catalog_casts, "", text)
    return re.sub(r"[\s\"\[\]()`]", "", text).lower()


def _predicate_of(text: str | None) -> str | None:
    """The predicate of a catalog row: the text itself, or what follows WHERE in a CREATE."""
    if text is None:
        return None
    match = re.search(r"\bwhere\b", text, flags=re.IGNORECASE)
    if text.lstrip().upper().startswith("CREATE"):
        return text[match.end():] if match else None
    return text


def _compile(element: Any, dialect: Dialect) -> str:
    return ddl.compile_ddl(element, dialect)


def _type_text(type_: Any, dialect: Dialect) -> str:
    return " ".join(str(type_.compile(dialect=dialect)).upper().split())


#: A character type with a declared length: ``CHAR(32)``, ``VARCHAR(255)``, ``NVARCHAR(10)``.
_SIZED_TEXT = re.compile(r"^(?:N?VAR)?N?CHAR(?:ACTER)?(?: VARYING)?\(\d+\)$")


def _same_type(found: str, expected: str, support: dialects.DialectSupport) -> bool:
    """Whether the declared types *found* and *expected* are the same on the server.

    Where the length of a text column is not enforced (SQLite), ``VARCHAR(36)`` and
    ``CHAR(32)`` hold the same values: the migration leaves a declared length as it is, and
    verify does not report it.
    """
    if found == expected:
        return True
    return (
        not support.enforces_text_length
        and bool(_SIZED_TEXT.match(found))
        and bool(_SIZED_TEXT.match(expected))
    )


def add_column_statement(table: sa.Table, column: sa.Column[Any], dialect: Dialect) -> str:
    """``ALTER TABLE ... ADD`` of *column* of *table*, as *dialect* writes it."""
    copy = sqlalchemy_internals.copied_column(column)
    # Bound to a table, as op.add_column does (SQL Server's DDL needs one).
    sa.Table(table.name, sa.MetaData(), copy, schema=table.schema)
    return _compile(alembic_ddl.AddColumn(table.name, copy, table.schema), dialect)


def alter_column_statements(
    table: sa.Table, column: sa.Column[Any], dialect: Dialect, what: str
) -> tuple[str, ...]:
    """The ``ALTER COLUMN`` giving *column* its type (*what* ``"type"``) or its nullability.

    SQL Server restates both in one statement (an ``ALTER COLUMN`` naming the type alone would
    make the column nullable); PostgreSQL alters the one that differs.
    """
    if dialects.for_dialect(dialect).alter_column == "restate" or what != "type":
        element: Any = alembic_ddl.ColumnNullable(
            table.name, column.name, bool(column.nullable), schema=table.schema,
            existing_type=column.type,
        )
    else:
        element = alembic_ddl.ColumnType(table.name, column.name, column.type, schema=table.schema)
    return (_compile(element, dialect),)


@dataclasses.dataclass(frozen=True)
class _IndexOnServer:
    name: str
    predicate: str | None = None
    clustered: bool = False
    included: tuple[str, ...] = ()


class _Checker:
    """Compares one expected table with the one on the server."""

    def __init__(self, connection: Connection, expected: sa.Table, shown: str) -> None:
        self.connection = connection
        self.dialect = connection.dialect
        self.support = dialects.for_dialect(connection)
        self.expected = expected
        self.shown = shown
        self.inspector = sa.inspect(connection)
        self.schema = expected.schema
        self.drifts: list[Drift] = []
        #: Whether a repair rebuilds the table (SQLite): it re-creates every index too.
        self.rebuilt = False

    def drift(self, kind: str, subject: str, found: str, expected: str, *repair: str) -> None:
        self.drifts.append(Drift(self.shown, kind, subject, found, expected, tuple(repair)))

    # -- columns and constraints -------------------------------------------------------
    def rebuild(self) -> tuple[str, ...]:
        """SQLite: the statements rebuilding the table in its expected layout, rows kept."""
        self.rebuilt = True
        table = self.expected
        temporary = table.to_metadata(sa.MetaData(), name=quoted_name(
            f"{table.name}{REBUILD_SUFFIX}", quote=True))
        for index in list(temporary.indexes):
            temporary.indexes.discard(index)
        present = {column["name"] for column in self.inspector.get_columns(
            table.name, schema=self.schema)}
        common = [column.name for column in table.columns if column.name in present]
        source = sa.table(table.name, *(sa.column(name) for name in common), schema=self.schema)
        copy = sa.insert(temporary).from_select(
            [temporary.c[table.c[name].key] for name in common] if common else [],
            sa.select(*(source.c[name] for name in common)),
        )
        statements = [
            _compile(sa.schema.CreateTable(temporary), self.dialect),
            str(copy.compile(dialect=self.dialect, compile_kwargs={"literal_binds": True})),
            _compile(sa.schema.DropTable(sa.Table(table.name, sa.MetaData(),
                                                  schema=self.schema)), self.dialect),
            _compile(alembic_ddl.RenameTable(temporary.name, table.name, self.schema),
                     self.dialect),
        ]
        statements += [
            _compile(sa.schema.CreateIndex(index), self.dialect)
            for index in table.indexes
            if self.support.creates(index)
        ]
        return tuple(statements)

    def check_columns(self) -> None:
        found = {
            str(column["name"]): column
            for column in self.inspector.get_columns(self.expected.name, schema=self.schema)
        }
        rebuilds = self.support.alter_column == "rebuild"
        for column in self.expected.columns:
            expected_type = _type_text(column.type, self.dialect)
            there = found.get(column.name)
            if there is None:
                repair = (
                    self.rebuild()
                    if rebuilds and not column.nullable
                    else (add_column_statement(self.expected, column, self.dialect),)
                )
                self.drift("column", column.name, "missing", expected_type, *repair)
                continue
            found_type = _type_text(there["type"], self.dialect)
            if not _same_type(found_type, expected_type, self.support):
                repair = (
                    self.rebuild()
                    if rebuilds
                    else alter_column_statements(self.expected, column, self.dialect, "type")
                )
                self.drift("type", column.name, found_type, expected_type, *repair)
            if bool(there["nullable"]) != bool(column.nullable) and not (
                there["nullable"] and self._never_null(column.name, found_type)
            ):
                repair = (
                    self.rebuild()
                    if rebuilds
                    else alter_column_statements(
                        self.expected, column, self.dialect, "nullability"
                    )
                )
                self.drift(
                    "nullability",
                    column.name,
                    "NULL" if there["nullable"] else "NOT NULL",
                    "NULL" if column.nullable else "NOT NULL",
                    *repair,
                )

    def _never_null(self, name: str, found_type: str) -> bool:
        """Whether column *name* cannot hold NULL whatever it declares (SQLite's rowid)."""
        if not self.support.integer_key_never_null or found_type != "INTEGER":
            return False
        key = self.inspector.get_pk_constraint(self.expected.name, schema=self.schema)
        return list(key.get("constrained_columns") or ()) == [name]

    def check_constraints(self) -> None:
        if self.support.alter_column == "rebuild":
            return  # the key is part of the column layout: a rebuild repairs it
        primary = self.expected.primary_key
        if primary.columns and self.support.creates(primary):
            found = self.inspector.get_pk_constraint(self.expected.name, schema=self.schema)
            wanted = [column.name for column in primary.columns]
            have = list(found.get("constrained_columns") or [])
            if have != wanted:
                repair: list[str] = []
                if have and found.get("name"):
                    repair.append(self._drop_constraint(str(found["name"]), "primary"))
                repair.append(_compile(sa.schema.AddConstraint(primary), self.dialect))
                self.drift("constraint", "primary key", ", ".join(have) or "missing",
                           ", ".join(wanted), *repair)
        uniques = {
            tuple(found["column_names"])
            for found in self.inspector.get_unique_constraints(
                self.expected.name, schema=self.schema)
        }
        for constraint in self.expected.constraints:
            if not isinstance(constraint, sa.UniqueConstraint) or not self.support.creates(
                constraint
            ):
                continue
            wanted_columns = tuple(column.name for column in constraint.columns)
            if wanted_columns not in uniques:
                self.drift("constraint", f"unique {constraint.name}", "missing",
                           f"UNIQUE ({', '.join(wanted_columns)})",
                           _compile(sa.schema.AddConstraint(constraint), self.dialect))

    def _drop_constraint(self, name: str, type_: str) -> str:
        table = sa.Table(self.expected.name, sa.MetaData(), schema=self.schema)
        constraint = sa.PrimaryKeyConstraint(name=quoted_name(name, quote=True))
        table.append_constraint(constraint)
        return _compile(sa.schema.DropConstraint(constraint), self.dialect)

    # -- indexes ------------------------------------------------------------------------
    def indexes_on_server(self) -> dict[str, _IndexOnServer]:
        catalog = self.support.index_catalog
        rows: list[Any] = []
        if catalog:
            qualified = self.dialect.identifier_preparer.format_table(self.expected)
            rows = list(self.connection.execute(
                sa.text(catalog), {"table": qualified, "name": self.expected.name}))
        found: dict[str, _IndexOnServer] = {}
        for name, predicate, clustered, included in rows:
            if name is None:
                continue
            before = found.get(name, _IndexOnServer(str(name)))
            found[name] = dataclasses.replace(
                before,
                predicate=_predicate_of(predicate),
                clustered=bool(clustered),
                included=before.included + ((str(included),) if included else ()),
            )
        return found

    def check_indexes(self) -> bool:
        """Compare the indexes; return whether any drifted."""
        reflected = {
            str(index["name"]): index
            for index in self.inspector.get_indexes(self.expected.name, schema=self.schema)
        }
        catalog = self.indexes_on_server()
        drifted = False
        for index in sorted(self.expected.indexes, key=lambda each: str(each.name)):
            if not self.support.creates(index):
                continue
            name = str(index.name)
            create = _compile(sa.schema.CreateIndex(index), self.dialect)
            drop = _compile(sa.schema.DropIndex(index), self.dialect)
            options = self.support.options_of(index)
            expected = self._index_shape(index, options)
            there = reflected.get(name)
            if there is None and name not in catalog:
                self.drift("index", name, "missing", expected,
                           *(self.rebuild() if self.rebuilt else (create,)))
                drifted = True
                continue
            on_server = catalog.get(name, _IndexOnServer(name))
            columns = [str(name) for name in there["column_names"]] if there is not None else []
            found = self._found_shape(columns, on_server)
            if _normalised(found, self.support) != _normalised(expected, self.support):
                self.drift("index", name, found, expected,
                           *(self.rebuild() if self.rebuilt else (drop, create)))
                drifted = True
        return drifted

    def _index_shape(self, index: sa.Index, options: Any) -> str:
        columns = ", ".join(str(column.name) for column in index.columns)
        text = f"({columns})"
        include = options.get("include") or ()
        if include and self.support.index_catalog:
            names = [
                str(self.expected.c[item].name) if isinstance(item, str) and item in
                self.expected.c else str(getattr(item, "name", item))
                for item in include
            ]
            text += f" INCLUDE ({', '.join(sorted(names))})"
        if options.get("clustered"):
            text += " CLUSTERED"
        where = options.get("where")
        if where is not None:
            compiled = where.compile(
                dialect=self.dialect, compile_kwargs={"literal_binds": True, "include_table": False}
            )
            text += f" WHERE {compiled}"
        return text

    def _found_shape(self, columns: Sequence[str], on_server: _IndexOnServer) -> str:
        text = f"({', '.join(columns)})"
        if on_server.included:
            text += f" INCLUDE ({', '.join(sorted(on_server.included))})"
        if on_server.clustered:
            text += " CLUSTERED"
        if on_server.predicate:
            text += f" WHERE {on_server.predicate}"
        return text

    def check_storage(self) -> None:
        """The table's storage settings (PostgreSQL ``WITH``: fillfactor, autovacuum)."""
        catalog, template = self.support.storage_catalog, self.support.storage_ddl
        wanted = self.support.options_of(self.expected).get("with") if catalog else None
        if not wanted or not template:
            return
        qualified = self.dialect.identifier_preparer.format_table(self.expected)
        found = dict(
            str(row).partition("=")[::2]
            for row in self.connection.scalars(sa.text(catalog), {"table": qualified})
        )
        for name, value in dict(wanted).items():
            have = found.get(str(name))
            if have != str(value):
                self.drift(
                    "storage", str(name), "unset" if have is None else have, str(value),
                    template.format(table=qualified, settings=f"{name}={value}"),
                )

    def run(self) -> list[Drift]:
        self.check_columns()
        self.check_constraints()
        self.check_indexes()
        self.check_storage()
        return self.drifts


def _is_queue_candidate(columns: frozenset[str], signature: Sequence[str]) -> bool:
    """A queue table, or one that lost one column of the signature (but not its order)."""
    if schema.is_queue_table(columns):
        return True
    present = [name for name in signature if name in columns]
    return len(present) >= len(signature) - 1 and signature[-1] in columns and (
        signature[2] in columns
    )


def _shown(name: str, schema_name: str | None) -> str:
    return str(addressing.QueueAddress(name, schema_name))


def _sql_server_layout(connection: Connection, table: sa.Table) -> str:
    """``heap`` when the queue table on the server has no clustered index, else ``clustered``."""
    checker = _Checker(connection, table, table.name)
    if any(index.clustered for index in checker.indexes_on_server().values()):
        return "clustered"
    return "heap"


def _trigger_drifts(
    connection: Connection,
    table: sa.Table,
    shown: str,
    expected_here: bool,
    wakeup: dialects.statements.NotifyWakeup,
) -> list[Drift]:
    quoted = connection.dialect.identifier_preparer.format_table(table)
    row = connection.execute(
        sa.text(wakeup.trigger_catalog), {"table": quoted, "trigger": wakeup.trigger}
    ).first()
    if row is None and not expected_here:
        return []
    schema, name = connection.execute(sa.text(wakeup.table_identity), {"table": quoted}).one()
    key = wakeup.table_key(str(schema), str(name))
    repair = (
        wakeup.create_function.strip(),
        wakeup.drop_trigger.format(table=quoted),
        wakeup.trigger_statement(quoted, key),
    )
    expected = (
        "AFTER INSERT FOR EACH STATEMENT calling " + wakeup.function + " while an endpoint waits"
    )
    if row is None:
        return [Drift(shown, "trigger", wakeup.trigger, "missing", expected, repair)]
    definition, source = str(row[0]), str(row[1] or "")
    if wakeup.trigger_is_current(definition, source, key):
        return []
    return [Drift(shown, "trigger", wakeup.trigger, definition, expected, repair)]


def verify(
    connection: Connection,
    schemas: Iterable[str | None] = (None,),
    *,
    wakeup_queues: Iterable[str] = (),
    sql_server_layout: str | None = None,
) -> list[Drift]:
    """Every drift of this package's tables in *schemas* from the layout of the dialect.

    :param connection: a connection to the database (nothing is changed).
    :param schemas: the schemas to look in (``None``: the default one).
    :param wakeup_queues: queue table names that must have the PostgreSQL wake-up trigger
        (an existing trigger is checked on every queue table).
    :param sql_server_layout: SQL Server: ``"clustered"`` or ``"heap"``; ``None`` accepts the
        layout each table has.
    :raises ConfigurationError: a schema that does not exist, or an unknown layout.
    """
    if sql_server_layout is not None and sql_server_layout not in SQL_SERVER_LAYOUTS:
        raise exceptions.ConfigurationError(
            f"SQL Server layout {sql_server_layout!r} is not one of {SQL_SERVER_LAYOUTS}"
        )
    support = dialects.for_dialect(connection)
    inspector = sa.inspect(connection)
    schemas = tuple(schemas)
    known = set(inspector.get_schema_names())
    for name in schemas:
        if name is not None and name not in known:
            raise exceptions.ConfigurationError(f"schema {name!r} does not exist")
    wanted_triggers = set(wakeup_queues)
    signature = support.queue_signature
    drifts: list[Drift] = []
    for schema_name in schemas:
        tables = sorted(inspector.get_table_names(schema=schema_name))
        for name in tables:
            if name.endswith(REBUILD_SUFFIX):
                continue
            columns = frozenset(
                str(column["name"]) for column in inspector.get_columns(name, schema_name)
            )
            expected = _expected_table(
                connection, name, schema_name, columns, signature, sql_server_layout
            )
            if expected is None:
                continue
            shown = _shown(name, schema_name)
            table_drifts = _Checker(connection, expected, shown).run()
            wakeup = support.notify_wakeup
            if wakeup is not None and _is_queue_candidate(columns, signature):
                table_drifts += _trigger_drifts(
                    connection, expected, shown, name in wanted_triggers, wakeup
                )
            for drift in table_drifts:
                log.warning(
                    "queue %s: %s %s: found %s, expected %s",
                    drift.table, drift.kind, drift.subject, drift.found, drift.expected,
                )
            drifts += table_drifts
            wanted_triggers.discard(name)
    for name in sorted(wanted_triggers):
        raise exceptions.QueueNotFound(name)
    return drifts


def _expected_table(
    connection: Connection,
    name: str,
    schema_name: str | None,
    columns: frozenset[str],
    signature: Sequence[str],
    sql_server_layout: str | None = None,
) -> sa.Table | None:
    """The table this version would create for table *name*, or None if it is not ours."""
    support = dialects.for_dialect(connection)
    quoted_schema = None if schema_name is None else quoted_name(schema_name, quote=True)
    shared = models.Base.metadata.tables  # every model module imported: all shared tables
    if name in shared:
        table = shared[name]
        if quoted_schema is None:
            return table
        return table.to_metadata(sa.MetaData(), schema=quoted_schema)
    if name == SUBSCRIPTION_TABLE:
        return subscription_table(connection, schema_name)
    if set(support.delayed_signature) <= columns:
        return build_delayed_table(sa.MetaData(), name, schema_name, connection)
    if _is_queue_candidate(columns, signature):
        table = build_queue_table(sa.MetaData(), name, schema_name, connection)
        if support.table_layouts:
            layout = sql_server_layout or _sql_server_layout(connection, table)
            table = build_queue_table(
                sa.MetaData(), name, schema_name, connection, sql_server_layout=layout
            )
        return table
    return None
