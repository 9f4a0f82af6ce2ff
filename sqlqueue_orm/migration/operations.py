"""``op.upgrade_queue_tables(revision)`` / ``op.downgrade_queue_tables(revision)``, the Alembic way.

Registered with :meth:`Operations.register_operation`, so a revision reads::

    from alembic import op
    import sqlqueue_orm.migration.operations  # registers the operations

    def upgrade():
        op.upgrade_queue_tables("0001_expires_index")

Online, the operation finds the queue tables (:mod:`~sqlqueue_orm.migration.discovery`), logs
one line per table with its row count, and applies the step table by table: SQLite in the
migration's transaction (:mod:`~sqlqueue_orm.migration.sqlite`); SQL Server and PostgreSQL each
table in its own transaction, outside Alembic's (``autocommit_block``), so locks are never held
across tables and ``CREATE INDEX CONCURRENTLY`` can run. A crash midway leaves some tables done and
the revision not stamped; the steps are idempotent, so running again finishes the job.

Offline (``--sql``) it writes the script instead and never queries the database: one named block
per table with ``-x queues=...``, else a server-side loop (:mod:`~sqlqueue_orm.migration.tsql`,
:mod:`~sqlqueue_orm.migration.plpgsql`).
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from alembic.operations import MigrateOperation, Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm.migration import discovery, plpgsql, sqlite, steps, tsql
from sqlqueue_orm.queuing import sql

log = logging.getLogger(__name__)

#: The ``context.configure()`` option carrying the run's :class:`~.discovery.Target`.
TARGET_OPTION = "sqlqueue_target"


class RawSql(sa.sql.expression.Executable, sa.sql.expression.ClauseElement):
    """A finished statement or batch, written to an offline script exactly as it is."""

    inherit_cache = False

    def __init__(self, text: str) -> None:
        self.text = text


@compiles(RawSql)
def _compile_raw(element: RawSql, compiler: SQLCompiler, **kw: Any) -> str:
    return element.text


@Operations.register_operation("upgrade_queue_tables")
class UpgradeQueueTablesOp(MigrateOperation):
    """Apply a queue table step to every queue table the run targets."""

    direction = "upgrade"

    def __init__(self, revision: str) -> None:
        steps.step(revision, self.direction)
        self.revision = revision

    @classmethod
    def upgrade_queue_tables(cls, operations: Operations, revision: str) -> None:
        """Upgrade every queue table by step *revision* (``"0001_expires_index"``, ...).

        :param revision: the step, named as the revision that applies it.
        """
        operations.invoke(cls(revision))

    def reverse(self) -> DowngradeQueueTablesOp:
        """The downgrade of the same step."""
        return DowngradeQueueTablesOp(self.revision)


@Operations.register_operation("downgrade_queue_tables")
class DowngradeQueueTablesOp(MigrateOperation):
    """Undo a queue table step on every queue table the run targets."""

    direction = "downgrade"

    def __init__(self, revision: str) -> None:
        steps.step(revision, self.direction)
        self.revision = revision

    @classmethod
    def downgrade_queue_tables(cls, operations: Operations, revision: str) -> None:
        """Downgrade every queue table by step *revision*.

        :param revision: the step, named as the revision that applies it.
        """
        operations.invoke(cls(revision))

    def reverse(self) -> UpgradeQueueTablesOp:
        """The upgrade of the same step."""
        return UpgradeQueueTablesOp(self.revision)


@Operations.implementation_for(UpgradeQueueTablesOp)
def _upgrade(operations: Operations, operation: UpgradeQueueTablesOp) -> None:
    run(operations, operation.revision, operation.direction)


@Operations.implementation_for(DowngradeQueueTablesOp)
def _downgrade(operations: Operations, operation: DowngradeQueueTablesOp) -> None:
    run(operations, operation.revision, operation.direction)


def target_of(context: MigrationContext) -> discovery.Target:
    """The run's target (schemas, named queues), as the environment configured it."""
    target = context.opts.get(TARGET_OPTION)
    return target if isinstance(target, discovery.Target) else discovery.Target()


def run(operations: Operations, revision: str, direction: str) -> None:
    """Apply step *revision* in *direction*: online to each queue table, offline as a script."""
    context = operations.get_context()
    target = target_of(context)
    if context.as_sql:
        _offline(operations, context, target, revision, direction)
    else:
        _online(context, target, revision, direction)


def _offline(
    operations: Operations,
    context: MigrationContext,
    target: discovery.Target,
    revision: str,
    direction: str,
) -> None:
    name = context.dialect.name
    statements: list[str] = []
    if not steps.applies_to(revision, name):
        return
    if name == "mssql":
        if target.queues:
            statements = [
                tsql.table_batch(revision, direction, address) for address in target.addresses()
            ]
        else:
            statements = [tsql.loop_batch(revision, direction, target.schemas)]
    elif name == "postgresql":
        if target.queues:
            for address in target.addresses():
                statements += plpgsql.table_statements(revision, direction, address)
        else:
            statements = [plpgsql.loop_statement(revision, direction, target.schemas)]
    else:
        raise exceptions.ConfigurationError(
            f"offline scripts (--sql) are written for SQL Server and PostgreSQL, not {name}; "
            "migrate SQLite online (sqlqueue migrate, or alembic upgrade head without --sql)"
        )
    # Each table runs in its own transaction (and CONCURRENTLY needs none around it).
    with context.autocommit_block():
        for statement in statements:
            operations.execute(RawSql(statement))


def _online(
    context: MigrationContext, target: discovery.Target, revision: str, direction: str
) -> None:
    connection = context.connection
    assert connection is not None
    name = connection.dialect.name
    step = steps.step(revision, direction)
    if not steps.applies_to(revision, name):
        log.info("nothing to do on %s: %s", name, step.describe(direction))
        return
    addresses = discovery.find(connection, target)
    if name == "postgresql" and revision != steps.NSB_LAYOUT:
        # Earlier steps know only the SQL Server column layout; a table already in
        # NServiceBus's PostgreSQL layout is past them.
        addresses = [a for a in addresses if not _in_nsb_layout(connection, a, step, direction)]
    if not addresses:
        log.info("no queue tables in %s: %s", _where(target), step.describe(direction))
    if name == "sqlite":
        for address in addresses:
            sqlite.apply(connection, revision, direction, address)
        return
    if name not in ("postgresql", "mssql"):
        raise exceptions.ConfigurationError(f"queue tables cannot be migrated on {name}")
    with context.autocommit_block():
        autocommit = context.connection
        assert autocommit is not None
        for address in addresses:
            log.info(
                "queue %s: %s (%d rows)",
                address,
                step.describe(direction),
                _count(autocommit, address),
            )
            if name == "mssql":
                _run_batch(autocommit, tsql.table_batch(revision, direction, address), address)
            else:
                for statement in plpgsql.table_statements(revision, direction, address):
                    autocommit.exec_driver_sql(statement, execution_options={"no_parameters": True})


def _in_nsb_layout(
    connection: Connection, address: addressing.QueueAddress, step: steps.Step, direction: str
) -> bool:
    if not set(steps.NSB_SIGNATURE) <= db.column_names(connection, address):
        return False
    log.info("queue %s: in NServiceBus's PostgreSQL layout; %s skipped", address,
             step.describe(direction))
    return True


def _where(target: discovery.Target) -> str:
    return ", ".join("the default schema" if s is None else repr(s) for s in target.schemas)


def _count(connection: Connection, address: addressing.QueueAddress) -> int:
    table = sql.format_table(connection.dialect, address)
    if connection.dialect.name == "mssql":
        # From the catalog: a COUNT(*) would scan (and lock) a big queue for nothing.
        statement = sa.text(
            "SELECT COALESCE(SUM(rows), 0) FROM sys.partitions "
            "WHERE object_id = OBJECT_ID(:table) AND index_id IN (0, 1)"
        ).bindparams(table=table)
    else:
        statement = sa.text(f"SELECT count(*) FROM {table}")
    return int(connection.execute(statement).scalar_one())


def _run_batch(connection: Connection, batch: str, address: addressing.QueueAddress) -> None:
    """Run a T-SQL batch on the raw cursor, draining every result so no error stays hidden."""
    dbapi_error = connection.dialect.loaded_dbapi.Error
    cursor = connection.connection.cursor()
    try:
        cursor.execute(batch)
        while cursor.nextset():
            pass
    except dbapi_error as error:
        raise exceptions.DatabaseError(f"queue {str(address)!r}: {error}") from error
    finally:
        cursor.close()
