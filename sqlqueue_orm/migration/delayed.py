"""Delayed tables (``<endpoint>.Delayed``) to the current layout: the index on Due.

A delayed table is found by its columns, whatever its name or suffix, as queue tables are:
``Headers, Body, Due, RowVersion`` without ``Expires`` (SQL Server, SQLite) or NServiceBus's
PostgreSQL ``id, headers, body, due`` without ``expires``. Tables created by an older
NServiceBus or by hand may lack the index on Due, which the mover's ``WHERE Due < now`` and
``ORDER BY Due`` need (without it, each run scans the table). It is created where no index
starts with Due, named as the transport names it (``Index_Due`` on SQL Server, ``<table>_Due``
on PostgreSQL, ``<table>_Index_Due`` on SQLite): see :mod:`sqlqueue_orm.models.delayed_table`.

Online: one line per table found. Offline (``--sql``): a server-side loop over the tables of
the target schemas (:meth:`~sqlqueue_orm.migration.impl.QueueTableImpl.delayed_index_loop`),
safe to run twice; SQLite is migrated online.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

from sqlqueue_orm import addressing, dialects, exceptions
from sqlqueue_orm.migration import impl, operations
from sqlqueue_orm.models.delayed_table import build_delayed_table

log = logging.getLogger("sqlqueue_orm.migration.operations")


def find(connection: Connection, schemas: tuple[str | None, ...]) -> list[addressing.QueueAddress]:
    """The delayed tables of *schemas* (by their columns: see the module docstring)."""
    support = dialects.for_dialect(connection)
    wanted = set(support.delayed_signature)
    expires = support.queue_signature[1]  # Expires / expires: only queue tables have it
    inspector = sa.inspect(connection)
    found = []
    for schema in schemas:
        for name in sorted(inspector.get_table_names(schema=schema)):
            columns = {str(column["name"]) for column in inspector.get_columns(name, schema)}
            if wanted <= columns and expires not in columns:
                found.append(addressing.QueueAddress(name, schema))
    return found


def _due_index(connection: Connection, address: addressing.QueueAddress) -> sa.Index:
    table = build_delayed_table(sa.MetaData(), address.table, address.schema, connection)
    support = dialects.for_dialect(connection)
    for index in table.indexes:
        if support.creates(index):
            return index
    raise exceptions.ConfigurationError(f"no Due index for {connection.dialect.name}")


def _has_due_index(connection: Connection, address: addressing.QueueAddress) -> bool:
    due = build_delayed_table(sa.MetaData(), address.table, None, connection).c.Due.name
    indexes = sa.inspect(connection).get_indexes(address.table, address.schema)
    return any(index["column_names"][:1] == [due] for index in indexes)


def upgrade() -> None:
    """Create the Due index of every delayed table that lacks it (online or as a script)."""
    context = op.get_context()
    target = operations.target_of(context)
    if context.as_sql:
        loop = impl.impl_for(context.dialect).delayed_index_loop(target.schemas)
        if loop is None:
            raise exceptions.ConfigurationError(
                f"offline scripts (--sql) are written for SQL Server and PostgreSQL, not "
                f"{context.dialect.name}; migrate SQLite online"
            )
        op.execute(operations.RawSql(loop))
        return
    connection = op.get_bind()
    found = find(connection, target.schemas)
    if not found:
        log.info("no delayed tables: nothing to do for the Due index")
    for address in found:
        if _has_due_index(connection, address):
            log.info("delayed table %s: already has its Due index", address)
            continue
        index = _due_index(connection, address)
        index.create(connection)
        log.info("delayed table %s: created index %s on Due", address, index.name)
