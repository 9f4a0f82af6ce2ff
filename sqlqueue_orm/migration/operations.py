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
:func:`sweep` ends every online upgrade, at head too: each queue table through every step of the
database's revision, one summary line per table.

Offline (``--sql``) it writes the script instead and never queries the database: one named block
per table with ``-x queues=...``, else a server-side loop (:mod:`~sqlqueue_orm.migration.tsql`,
:mod:`~sqlqueue_orm.migration.plpgsql`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import sqlalchemy as sa
from alembic.operations import MigrateOperation, Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.migration import discovery, plpgsql, sqlite, steps, tsql
from sqlqueue_orm.queuing import sql

log = logging.getLogger(__name__)

# The per-dialect branches left here (dialect.name == ...) are migration-time step dispatch and
# DDL; they move when migration/ becomes a class per dialect (issue 8, item 5). Run-time
# statements and catalog queries live in sqlqueue_orm.dialects.

#: The ``context.configure()`` option carrying the run's :class:`~.discovery.Target`.
TARGET_OPTION = "sqlqueue_target"
#: The ``context.configure()`` option carrying the run's :class:`Report`.
REPORT_OPTION = "sqlqueue_report"


@dataclasses.dataclass
class Report:
    """What an online run did to each queue table, step by step (for the sweep's summary)."""

    #: ``(table, step)`` pairs applied in this run, and whether the step changed the table.
    applied: dict[tuple[addressing.QueueAddress, str], bool] = dataclasses.field(
        default_factory=dict
    )

    def record(self, address: addressing.QueueAddress, revision: str, changed: bool) -> None:
        """Note that step *revision* ran on the table at *address* (and whether it acted)."""
        self.applied[(address, revision)] = changed

    def changed(self, address: addressing.QueueAddress) -> list[str]:
        """The steps that changed the table at *address* in this run, in the order they ran."""
        return [rev for (where, rev), acted in self.applied.items() if where == address and acted]

    def line(self, address: addressing.QueueAddress) -> str:
        """The summary of one table: ``upgraded: <steps>`` or ``already current``."""
        changed = self.changed(address)
        return f"upgraded: {', '.join(changed)}" if changed else "already current"


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


def report_of(context: MigrationContext) -> Report:
    """The run's report, as the environment configured it (a throw-away one otherwise)."""
    report = context.opts.get(REPORT_OPTION)
    return report if isinstance(report, Report) else Report()


def sweep(context: MigrationContext, revisions: list[str]) -> list[addressing.QueueAddress]:
    """Bring every queue table of the run's target through the upgrade steps *revisions*.

    Online runs end here, at head too: a queue table that appeared after its steps ran (a .NET
    v1 endpoint's new queue, a restored database) is upgraded like the others. A step that
    already ran on a table in this run is not repeated; the others find nothing to do on a
    current table (they are idempotent). Logs one line per table saying what was done.

    :param revisions: the queue steps the database's revision includes, oldest first.
    :returns: the queue tables found.
    """
    connection = context.connection
    assert connection is not None
    target = target_of(context)
    report = report_of(context)
    addresses = discovery.find(connection, target)
    if connection.in_transaction():
        connection.commit()  # only the look-up's reads: each table gets its own transaction
    if not addresses:
        log.info("no queue tables in %s", _where(target))
    failed: list[Exception] = []
    for address in addresses:
        pending = [
            rev
            for rev in revisions
            if (address, rev) not in report.applied
            and steps.applies_to(rev, connection.dialect.name)
        ]
        try:
            if connection.dialect.name == "sqlite":
                # One transaction per table: it is upgraded whole or not at all.
                with connection.begin():
                    _upgrade_one(connection, address, pending, report, target.cluster_heaps)
            elif pending:
                with context.autocommit_block():
                    assert context.connection is not None
                    _upgrade_one(context.connection, address, pending, report, target.cluster_heaps)
        except (exceptions.SqlQueueError, sa.exc.DBAPIError) as error:
            # One table that cannot be upgraded must not keep the others legacy: go on, then
            # fail the run (every later run tries again, and says so again).
            log.error("queue %s: not upgraded: %s", address, error)
            failed.append(error)
            continue
        log.info("queue %s: %s", address, report.line(address))
    if failed:
        raise failed[0]
    return addresses


def _upgrade_one(
    connection: Connection,
    address: addressing.QueueAddress,
    revisions: list[str],
    report: Report,
    cluster_heaps: bool = False,
) -> None:
    if connection.dialect.name == "sqlite":
        for revision in revisions:
            changed = apply(connection, revision, "upgrade", address, quiet=True)
            report.record(address, revision, changed)
        return
    before = layout(connection, address)
    for revision in revisions:
        if (
            connection.dialect.name == "postgresql"
            and revision != steps.NSB_LAYOUT
            and set(steps.NSB_SIGNATURE) <= db.column_names(connection, address)
        ):
            # Steps before NServiceBus's PostgreSQL layout know only the SQL Server columns; a
            # table already in that layout is past them.
            report.record(address, revision, False)
            continue
        _execute(connection, revision, "upgrade", address, cluster_heaps)
        after = layout(connection, address)
        report.record(address, revision, after != before)
        before = after


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
                tsql.table_batch(revision, direction, address, target.cluster_heaps)
                for address in target.addresses()
            ]
        else:
            statements = [
                tsql.loop_batch(revision, direction, target.schemas, target.cluster_heaps)
            ]
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
    report = report_of(context)
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
            report.record(address, revision, apply(connection, revision, direction, address))
        return
    with context.autocommit_block():
        autocommit = context.connection
        assert autocommit is not None
        for address in addresses:
            report.record(
                address,
                revision,
                apply(autocommit, revision, direction, address, cluster_heaps=target.cluster_heaps),
            )


def apply(
    connection: Connection,
    revision: str,
    direction: str,
    address: addressing.QueueAddress,
    *,
    quiet: bool = False,
    cluster_heaps: bool = False,
) -> bool:
    """Apply step *revision* in *direction* to one queue table; whether its layout changed.

    SQLite runs in the caller's transaction; SQL Server and PostgreSQL need *connection* in
    autocommit (each statement is its own transaction, ``CONCURRENTLY`` needs none around it).

    :param quiet: log nothing (the sweep logs one line per table instead of one per step).
    :param cluster_heaps: SQL Server: rebuild a heap (the NServiceBus 8+ layout) into a
        clustered table; by default a heap stays a heap.
    """
    name = connection.dialect.name
    step = steps.step(revision, direction)
    if name == "sqlite":
        if quiet:
            return bool(sqlite.changes(connection, revision, direction, address))
        return bool(sqlite.apply(connection, revision, direction, address))
    if name not in ("postgresql", "mssql"):
        raise exceptions.ConfigurationError(f"queue tables cannot be migrated on {name}")
    if not quiet:
        log.info(
            "queue %s: %s (%d rows)", address, step.describe(direction), _count(connection, address)
        )
    before = layout(connection, address)
    _execute(connection, revision, direction, address, cluster_heaps)
    return layout(connection, address) != before


def _execute(
    connection: Connection,
    revision: str,
    direction: str,
    address: addressing.QueueAddress,
    cluster_heaps: bool = False,
) -> None:
    """Run a step's statements on one table (SQL Server, PostgreSQL; autocommit)."""
    if connection.dialect.name == "mssql":
        _run_batch(
            connection, tsql.table_batch(revision, direction, address, cluster_heaps), address
        )
    else:
        for statement in plpgsql.table_statements(revision, direction, address):
            connection.exec_driver_sql(statement, execution_options={"no_parameters": True})


def layout(connection: Connection, address: addressing.QueueAddress) -> list[tuple[Any, ...]]:
    """What a step can change in a queue table: its columns and indexes, as the catalog has them.

    Two equal layouts mean a step did nothing to the table (the steps are idempotent).
    """
    statements = dialects.for_dialect(connection).layout_statements(
        sql.format_table(connection.dialect, address)
    )
    if statements:
        return [tuple(row) for statement in statements for row in connection.execute(statement)]
    inspector = sa.inspect(connection)
    schema = db.schema_argument(address)
    return [
        ("column", repr(sorted(inspector.get_columns(address.table, schema=schema), key=str))),
        ("index", repr(sorted(inspector.get_indexes(address.table, schema=schema), key=str))),
    ]


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
    statement = dialects.for_dialect(connection).row_count_statement(table)
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
