"""Installers and schema inspection for queue tables.

:class:`QueueInstaller` creates queue tables idempotently and safely when several processes start
at once: under ``sp_getapplock`` on SQL Server and a transaction-scoped advisory lock on
PostgreSQL (SQLite serializes writers itself). :class:`SchemaInspector` finds queue tables by
their column signature and warns, as NServiceBus does, about legacy shapes (no Expires index,
non-Unicode Headers), naming the fix.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, config, db, dialects
from sqlqueue_orm.models import ddl
from sqlqueue_orm.models.delayed_table import delayed_table
from sqlqueue_orm.models.queue_table import build_queue_table, queue_table
from sqlqueue_orm.queuing import sql

log = logging.getLogger(__name__)

#: Columns that make a table a queue table, whatever its name, in NServiceBus's SQL Server layout.
QUEUE_SIGNATURE = frozenset(dialects.SQLSERVER_SIGNATURE)
#: The same in every layout (each dialect's ``queue_signature`` is one of them).
QUEUE_SIGNATURES = frozenset(
    frozenset(signature)
    for signature in (dialects.SQLSERVER_SIGNATURE, dialects.POSTGRESQL_SIGNATURE)
)


def is_queue_table(columns: Iterable[str]) -> bool:
    """Whether a table with *columns* is a queue table, in either layout."""
    names = frozenset(columns)
    return any(signature <= names for signature in QUEUE_SIGNATURES)


def body_string_column(dialect_name: str) -> str:
    """The name of the optional computed column: ``bodystring`` (unquoted) on PostgreSQL."""
    return dialects.for_dialect(dialect_name).body_string_column


def body_string_statement(dialect: sa.engine.Dialect, address: addressing.QueueAddress) -> str:
    """``ALTER TABLE`` adding the optional ``BodyString`` computed column (run without params)."""
    template = dialects.for_dialect(dialect).body_string_ddl
    return sql.render(template, dialect, sql.format_table(dialect, address)).text


def _run_ddl(connection: Connection, statement: str) -> None:
    # Rendered for the driver, so pass (empty) parameters: a pyformat driver un-doubles any %.
    connection.exec_driver_sql(statement, () if connection.dialect.positional else {})


class QueueInstaller:
    """Creates queue tables: idempotent, and safe when several processes install at once.

    :param settings: the table layout (:class:`~sqlqueue_orm.config.QueueSettings`).
    """

    def __init__(self, settings: config.QueueSettings | None = None) -> None:
        self.settings = settings or config.QueueSettings()

    def _table(self, address: addressing.QueueAddress, dialect: Dialect) -> sa.Table:
        """The table to create: the cached model's, or a heap-layout copy on SQL Server."""
        schema = db.schema_argument(address)
        if (
            dialects.for_dialect(dialect).table_layouts
            and self.settings.sql_server_layout != "clustered"
        ):
            return build_queue_table(
                sa.MetaData(),
                address.table,
                schema,
                sql_server_layout=self.settings.sql_server_layout,
            )
        return queue_table(address.table, schema, dialect)

    def create(
        self, connection: Connection, address: addressing.QueueAddress, body_string: bool = False
    ) -> bool:
        """Create the queue table and its indexes if missing; return whether it was created.

        Runs in the caller's transaction, which should commit right after (the lock is
        transaction-scoped).
        """
        address.check_for(connection.dialect.name)
        schema = db.schema_argument(address)
        table = self._table(address, connection.dialect)
        dialects.for_dialect(connection).take_install_lock(connection, address)
        inspector = sa.inspect(connection)
        if (
            address.schema is not None
            and address.catalog is None
            and dialects.for_dialect(connection).creates_schemas
        ):
            if not inspector.has_schema(address.schema):
                connection.execute(sa.schema.CreateSchema(address.schema))
                log.info("queue %s: created schema %r", address, address.schema)
        if inspector.has_table(address.table, schema=schema):
            created = False
        else:
            try:
                table.create(connection, checkfirst=False)
            except exc.OperationalError as error:
                # SQLite engines not made by db.create_engine (no BEGIN IMMEDIATE): another
                # process created the table between our check and our CREATE.
                message = str(error.orig)
                if not (message.startswith("table ") and "already exists" in message):
                    raise
                created = False
            else:
                created = True
                log.info("queue %s: created table", address)
        column = body_string_column(connection.dialect.name)
        if body_string and column not in db.column_names(connection, address):
            _run_ddl(connection, body_string_statement(connection.dialect, address))
            log.info("queue %s: added computed column BodyString", address)
        return created

    def create_delayed(self, connection: Connection, address: addressing.QueueAddress) -> bool:
        """Create the delayed table *address* and its Due index if missing (see :meth:`create`)."""
        address.check_for(connection.dialect.name)
        schema = db.schema_argument(address)
        dialects.for_dialect(connection).take_install_lock(connection, address)
        if sa.inspect(connection).has_table(address.table, schema=schema):
            return False
        delayed_table(address.table, schema, connection.dialect).create(connection)
        log.info("queue %s: created delayed table", address)
        return True

    def ddl(
        self,
        address: addressing.QueueAddress,
        dialect: sa.engine.Dialect,
        body_string: bool = False,
    ) -> list[str]:
        """The statements :meth:`create` would run on an empty database, for review by a DBA."""
        table = self._table(address, dialect)
        statements = [ddl.compile_ddl(sa.schema.CreateTable(table), dialect)]
        # The clustered index first: built after, it would rebuild every other index.
        support = dialects.for_dialect(dialect)
        for index in sorted(table.indexes, key=lambda item: "RowVersion" not in str(item.name)):
            if not support.creates(index):
                continue
            statements.append(ddl.compile_ddl(sa.schema.CreateIndex(index), dialect))
        if body_string:
            statements.append(body_string_statement(dialect, address))
        return statements


@dataclasses.dataclass(frozen=True)
class QueueTableInfo:
    """A queue table found in the database."""

    address: addressing.QueueAddress
    columns: frozenset[str]


@dataclasses.dataclass(frozen=True)
class QueueTableLayout:
    """A queue table's columns (name: SQLAlchemy's column info) and indexes, as looked up."""

    columns: Mapping[str, Any]
    indexes: tuple[Any, ...]


class SchemaInspector:
    """Finds queue tables and checks them against the current layout."""

    def find_queue_tables(
        self, connection: Connection, schemas: Iterable[str | None] = (None,)
    ) -> list[QueueTableInfo]:
        """Tables in *schemas* (``None``: the default) whose columns carry the queue signature."""
        inspector = sa.inspect(connection)
        found = []
        for schema in schemas:
            for name in sorted(inspector.get_table_names(schema=schema)):
                columns = frozenset(
                    str(column["name"]) for column in inspector.get_columns(name, schema=schema)
                )
                if is_queue_table(columns):
                    found.append(QueueTableInfo(addressing.QueueAddress(name, schema), columns))
        return found

    def find_delayed_tables(
        self, connection: Connection, schemas: Iterable[str | None] = (None,), suffix: str = ""
    ) -> list[addressing.QueueAddress]:
        """Delayed tables (``<endpoint>.<suffix>`` with the delayed signature) in *schemas*."""
        wanted = set(dialects.for_dialect(connection).delayed_signature)
        inspector = sa.inspect(connection)
        found = []
        for schema in schemas:
            for name in sorted(inspector.get_table_names(schema=schema)):
                if suffix and not name.endswith(f".{suffix}"):
                    continue
                columns = {str(column["name"]) for column in inspector.get_columns(name, schema)}
                if wanted <= columns:
                    found.append(addressing.QueueAddress(name, schema))
        return found

    def look_up(
        self, connection: Connection, address: addressing.QueueAddress, *, indexes: bool = True
    ) -> QueueTableLayout | None:
        """The table's columns (and *indexes*), in one catalog look-up; None if it is absent.

        The first use of a queue runs this once and both checks read it: the schema warnings
        (:meth:`problems_in`) and the hot path's probe (``TableQueue.probe(columns=...)``).
        """
        schema = db.schema_argument(address)
        inspector = sa.inspect(connection)
        try:
            columns = {
                str(c["name"]): c for c in inspector.get_columns(address.table, schema=schema)
            }
            found = inspector.get_indexes(address.table, schema=schema) if indexes else []
        except exc.NoSuchTableError:
            return None
        return QueueTableLayout(columns, tuple(found))

    def problems(self, connection: Connection, address: addressing.QueueAddress) -> list[str]:
        """What is outdated in the queue table, each with its fix; empty when it is current."""
        return self.problems_in(self.look_up(connection, address), connection.dialect.name)

    def problems_in(self, layout: QueueTableLayout | None, dialect_name: str) -> list[str]:
        """:meth:`problems` of a layout already looked up (none for an absent table)."""
        if layout is None:
            return []
        columns, indexes = layout.columns, layout.indexes
        found = []
        support = dialects.for_dialect(dialect_name)
        if support.queue_layout is dialects.QueueLayout.SEQ and QUEUE_SIGNATURE <= set(columns):
            found.append(
                'is in the layout before NServiceBus\'s PostgreSQL one ("Id" ... "RowVersion"); '
                "neither .NET endpoints nor this version can use it (fix: `sqlqueue migrate`)"
            )
        if not any(
            (index["column_names"] or [None])[0] in ("Expires", "expires") for index in indexes
        ):
            found.append(
                "does not contain an index for column 'Expires'; purging and receiving expired "
                "messages will scan the table (fix: `sqlqueue migrate`)"
            )
        headers = columns.get("Headers")
        if headers is not None and support.narrow_text_headers:
            type_name = type(headers["type"]).__name__.upper()
            if type_name in ("VARCHAR", "TEXT", "STRING"):
                found.append(
                    "has a non Unicode-compatible Headers column (varchar); non-ASCII headers "
                    "may be lost (fix: `sqlqueue migrate`)"
                )
        return found

    def warn(self, connection: Connection, address: addressing.QueueAddress) -> list[str]:
        """Log each problem of the table as a warning naming the queue; return them."""
        return self.warn_about(
            address, self.look_up(connection, address), connection.dialect.name
        )

    def warn_about(
        self,
        address: addressing.QueueAddress,
        layout: QueueTableLayout | None,
        dialect_name: str,
    ) -> list[str]:
        """:meth:`warn` for a layout :meth:`look_up` already found (``None``: no table)."""
        found = self.problems_in(layout, dialect_name)
        for problem in found:
            log.warning("queue %s: table %s", address, problem)
        return found
