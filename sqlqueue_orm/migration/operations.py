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

Every dialect's part is behind :func:`~sqlqueue_orm.migration.impl.impl_for`: this module never
branches on a dialect.
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

from sqlqueue_orm import addressing, exceptions
from sqlqueue_orm.migration import discovery, impl, steps

log = logging.getLogger(__name__)

# Per-dialect work goes through migration.impl (one QueueTableImpl per dialect); run-time
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


class _QueueTablesOp(MigrateOperation):
    """A queue table step in one direction, applied to every queue table the run targets."""

    direction = "upgrade"

    def __init__(self, revision: str) -> None:
        steps.step(revision, self.direction)
        self.revision = revision


# The two operations mirror each other on purpose: Alembic registers an operation by a
# classmethod of its own name on its own class, and each names the other as its reverse.
@Operations.register_operation("upgrade_queue_tables")
class UpgradeQueueTablesOp(_QueueTablesOp):
    """Apply a queue table step to every queue table the run targets."""

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
class DowngradeQueueTablesOp(_QueueTablesOp):
    """Undo a queue table step on every queue table the run targets."""

    direction = "downgrade"

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
    dialect = impl.impl_for(connection.dialect, cluster_heaps=target.cluster_heaps)
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
            if (address, rev) not in report.applied and dialect.applies_to(rev)
        ]
        try:
            if pending:
                with dialect.table_transaction(context) as table_connection:
                    for revision, changed in dialect.upgrade_table(
                        table_connection, address, pending
                    ):
                        report.record(address, revision, changed)
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
    dialect = impl.impl_for(context.dialect, cluster_heaps=target.cluster_heaps)
    if not dialect.applies_to(revision):
        return
    if not dialect.offline:
        raise exceptions.ConfigurationError(
            f"offline scripts (--sql) are written for SQL Server and PostgreSQL, not "
            f"{dialect.name}; migrate SQLite online (`sqlqueue migrate`, or alembic upgrade head "
            "without --sql)"
        )
    if target.queues:
        statements = [
            statement
            for address in target.addresses()
            for statement in dialect.table_statements(revision, direction, address)
        ]
    else:
        statements = dialect.loop_statements(revision, direction, target.schemas)
    # Each table runs in its own transaction (and CONCURRENTLY needs none around it).
    with context.autocommit_block():
        for statement in statements:
            operations.execute(RawSql(statement))


def _online(
    context: MigrationContext, target: discovery.Target, revision: str, direction: str
) -> None:
    connection = context.connection
    assert connection is not None
    dialect = impl.impl_for(connection.dialect, cluster_heaps=target.cluster_heaps)
    step = steps.step(revision, direction)
    report = report_of(context)
    if not dialect.applies_to(revision):
        log.info("nothing to do on %s: %s", dialect.name, step.describe(direction))
        return
    addresses = [
        address
        for address in discovery.find(connection, target)
        if not _skipped(dialect, connection, address, step, direction)
    ]
    if not addresses:
        log.info("no queue tables in %s: %s", _where(target), step.describe(direction))
    with dialect.steps_connection(context) as steps_connection:
        for address in addresses:
            report.record(
                address, revision, dialect.apply(steps_connection, revision, direction, address)
            )


def _skipped(
    dialect: impl.QueueTableImpl,
    connection: Connection,
    address: addressing.QueueAddress,
    step: steps.Step,
    direction: str,
) -> bool:
    reason = dialect.skips(connection, address, step.revision)
    if reason is None:
        return False
    log.info("queue %s: %s; %s skipped", address, reason, step.describe(direction))
    return True


def _where(target: discovery.Target) -> str:
    return ", ".join("the default schema" if s is None else repr(s) for s in target.schemas)
