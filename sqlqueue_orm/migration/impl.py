"""The interface each dialect's queue table migration implements, and the registry of them.

As Alembic's ``ddl/impl.py`` does it (``DefaultImpl`` and ``ImplMeta``): a subclass naming its
dialect in ``__dialect__`` registers itself, and :func:`impl_for` looks it up by the dialect's
name, so :mod:`~sqlqueue_orm.migration.operations` never branches on a dialect. An
implementation knows, for one step and one queue table, the statements
(:meth:`QueueTableImpl.table_statements`), the offline loop over the server's queue tables
(:meth:`QueueTableImpl.loop_statements`), the table's layout that tells whether a step changed
it (:meth:`QueueTableImpl.layout`), the row count of the progress lines
(:meth:`QueueTableImpl.count`) and how a batch runs (:meth:`QueueTableImpl.execute`).

The step bodies are functions of the implementation's :attr:`QueueTableImpl.bodies` module,
named after the step's concern in :data:`~sqlqueue_orm.migration.steps.STEPS`
(``upgrade_expires_index``, ``downgrade_rowversion_layout``, ...) and found by
:meth:`QueueTableImpl.body`: the step table is the one place a revision is tied to what it does,
and each implementation supplies only its SQL. The implementations are
:class:`~sqlqueue_orm.migration.tsql.MssqlImpl`,
:class:`~sqlqueue_orm.migration.plpgsql.PostgresqlImpl` and
:class:`~sqlqueue_orm.migration.sqlite.SqliteImpl`; any other dialect gets this base class,
which refuses to migrate queue tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm.migration import steps
from sqlqueue_orm.queuing import sql

if TYPE_CHECKING:
    from alembic.runtime.migration import MigrationContext

# Progress lines keep the logger docs/migrations.md shows them under.
log = logging.getLogger("sqlqueue_orm.migration.operations")

#: Every registered implementation by dialect name. The package imports each dialect's module
#: (as Alembic's ``ddl/__init__.py`` does), so all of them are here before any lookup.
_impls: dict[str, type[QueueTableImpl]] = {}

#: A queue table's layout as the catalog has it (see :meth:`QueueTableImpl.layout`).
Layout = list[tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class IndexVariant:
    """How a copy of a model index differs from it (see :meth:`QueueTableImpl.variant`)."""

    #: Keep the filter (``False``: the unfiltered index of earlier eras).
    where: bool = True
    #: SQL Server only; ``None`` keeps the model's.
    clustered: bool | None = None
    #: SQL Server ``WITH (...)`` options, replacing the model's.
    with_options: dict[str, str] | None = None
    #: PostgreSQL ``CONCURRENTLY``.
    concurrently: bool = False


class ImplMeta(type):
    """Registers each class that names its dialect in ``__dialect__``."""

    def __init__(cls, classname: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> None:
        super().__init__(classname, bases, namespace)
        dialect = namespace.get("__dialect__")
        if dialect is not None:
            _impls[dialect] = cast("type[QueueTableImpl]", cls)


class QueueTableImpl(metaclass=ImplMeta):
    """How one dialect applies the queue table steps; this base refuses every one of them."""

    # The implementations override these methods with the same signatures on purpose: the
    # lines they share with this class are the interface.

    __dialect__ = "default"
    #: Whether offline scripts (``--sql``) can be written: server-side loops, conditional DDL.
    offline = False
    #: Whether the steps run in the migration's transaction, a revision committing whole
    #: (SQLite), rather than each table in a transaction of its own (autocommit).
    transactional_ddl = False
    #: The module holding the step bodies, one function per step and direction named as
    #: :meth:`Step.method <sqlqueue_orm.migration.steps.Step.method>` names it (``None``: none).
    bodies: ModuleType | None = None

    def __init__(self, name: str | None = None, *, cluster_heaps: bool = False) -> None:
        #: The dialect's name (``mssql``, ``postgresql``, ``sqlite``, ...).
        self.name = name or self.__dialect__
        #: SQL Server: rebuild a heap (the NServiceBus 8+ layout) into a clustered table; by
        #: default a heap stays a heap.
        self.cluster_heaps = cluster_heaps

    def applies_to(self, revision: str) -> bool:
        """Whether step *revision* changes anything on this dialect."""
        return steps.applies_to(revision, self.name)

    def body(self, revision: str, direction: str) -> Callable[..., Any]:
        """The implementation of step *revision* in *direction* on this dialect.

        :raises ConfigurationError: an unknown step, or one this dialect does not implement.
        """
        step = steps.step(revision, direction)
        method = getattr(self.bodies, step.method(direction), None)
        if method is None:
            raise exceptions.ConfigurationError(
                f"queue tables cannot be migrated on {self.name} ({revision} {direction} is not "
                "implemented there)"
            )
        return cast("Callable[..., Any]", method)

    # -- index variants ----------------------------------------------------------------------
    def index_options(self, options: Any, variant: IndexVariant) -> dict[str, Any]:
        """The dialect keyword arguments of *variant* of an index (see :meth:`variant`).

        :param options: the model index's ``dialect_options`` of this dialect.
        """
        return {}

    def variant(self, index: sa.Index, **changes: Any) -> sa.Index:
        """A copy of model *index* (on a copy of its table) with some options changed.

        :param changes: fields of :class:`IndexVariant`.
        """
        assert index.table is not None
        table = index.table.to_metadata(sa.MetaData())
        kwargs = self.index_options(index.dialect_options[self.name], IndexVariant(**changes))
        columns = [table.c[str(column.name)] for column in index.columns]
        return sa.Index(index.name, *columns, **kwargs)

    # -- statements --------------------------------------------------------------------------
    def table_statements(
        self, revision: str, direction: str, address: addressing.QueueAddress
    ) -> list[str]:
        """The statements applying step *revision* in *direction* to the table at *address*."""
        raise exceptions.ConfigurationError(f"queue tables cannot be migrated on {self.name}")

    def loop_statements(
        self, revision: str, direction: str, schemas: Sequence[str | None]
    ) -> list[str]:
        """Statements finding every queue table of *schemas* on the server and applying a step.

        ``None`` in *schemas* stands for the default schema of whoever runs the script.
        """
        raise exceptions.ConfigurationError(f"queue tables cannot be migrated on {self.name}")

    def execute(
        self, connection: Connection, statements: Sequence[str], address: addressing.QueueAddress
    ) -> None:
        """Run finished *statements* on *connection* (in autocommit), one after the other."""
        for statement in statements:
            connection.exec_driver_sql(statement, execution_options={"no_parameters": True})

    def guarded_create_table(
        self, dialect: Dialect, name: str, elements: Sequence[sa.schema.SchemaItem]
    ) -> str | None:
        """Offline: a statement creating table *name* unless it exists.

        ``None``: the dialect's own ``CREATE TABLE IF NOT EXISTS`` does it.
        """
        return None

    def guarded_create_index(
        self,
        dialect: Dialect,
        name: str,
        table: str,
        columns: Sequence[str],
        kwargs: dict[str, Any],
    ) -> str | None:
        """Offline: a statement creating index *name* unless *table* has it.

        ``None``: the dialect's own ``CREATE INDEX IF NOT EXISTS`` does it.
        """
        return None

    def delayed_index_loop(self, schemas: Sequence[str | None]) -> str | None:
        """Offline: a batch creating the missing Due index of the delayed tables of *schemas*.

        Revision ``0009_delayed_delivery``; ``None``: the dialect is not migrated offline.
        """
        return None

    # -- the catalog ---------------------------------------------------------------------------
    def layout(self, connection: Connection, address: addressing.QueueAddress) -> Layout:
        """What a step can change in a queue table: its columns and indexes, from the catalog.

        Two equal layouts mean a step did nothing to the table (the steps are idempotent).
        """
        inspector = sa.inspect(connection)
        schema = db.schema_argument(address)
        return [
            ("column", repr(sorted(inspector.get_columns(address.table, schema=schema), key=str))),
            ("index", repr(sorted(inspector.get_indexes(address.table, schema=schema), key=str))),
        ]

    def count(self, connection: Connection, address: addressing.QueueAddress) -> int:
        """The number of rows in the table at *address* (for progress lines)."""
        table = sql.format_table(connection.dialect, address)
        return int(connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())

    def skips(
        self, connection: Connection, address: addressing.QueueAddress, revision: str
    ) -> str | None:
        """Why the table at *address* is already past step *revision* (``None``: it is not)."""
        return None

    # -- running steps -----------------------------------------------------------------------
    def apply(
        self,
        connection: Connection,
        revision: str,
        direction: str,
        address: addressing.QueueAddress,
        *,
        quiet: bool = False,
    ) -> bool:
        """Apply step *revision* in *direction* to one queue table; whether its layout changed.

        Here *connection* is in autocommit (each statement its own transaction, ``CONCURRENTLY``
        needs none around it); SQLite's runs in the caller's transaction.

        :param quiet: log nothing (the sweep logs one line per table instead of one per step).
        """
        step = steps.step(revision, direction)
        statements = self.table_statements(revision, direction, address)
        if not quiet:
            log.info(
                "queue %s: %s (%d rows)",
                address,
                step.describe(direction),
                self.count(connection, address),
            )
        before = self.layout(connection, address)
        self.execute(connection, statements, address)
        return self.layout(connection, address) != before

    def upgrade_table(
        self, connection: Connection, address: addressing.QueueAddress, revisions: Sequence[str]
    ) -> Iterator[tuple[str, bool]]:
        """Upgrade one table by *revisions* in turn (the sweep), without progress lines.

        :returns: each revision as it is done, with whether it changed the table.
        """
        before = self.layout(connection, address)
        for revision in revisions:
            if self.skips(connection, address, revision) is not None:
                yield revision, False
                continue
            statements = self.table_statements(revision, "upgrade", address)
            self.execute(connection, statements, address)
            after = self.layout(connection, address)
            yield revision, after != before
            before = after

    @contextlib.contextmanager
    def steps_connection(self, context: MigrationContext) -> Iterator[Connection]:
        """The connection a revision's steps run on.

        Here in autocommit, outside Alembic's transaction: each table gets a transaction of its
        own, so locks are never held across tables.
        """
        with context.autocommit_block():
            assert context.connection is not None
            yield context.connection

    @contextlib.contextmanager
    def table_transaction(self, context: MigrationContext) -> Iterator[Connection]:
        """The connection the sweep upgrades one table on (here: in autocommit)."""
        with self.steps_connection(context) as connection:
            yield connection


def impl_for(dialect: Dialect | str, *, cluster_heaps: bool = False) -> QueueTableImpl:
    """The queue table implementation of *dialect* (a dialect, or its name).

    A dialect without one gets :class:`QueueTableImpl`, which refuses every step.

    :param cluster_heaps: see :attr:`QueueTableImpl.cluster_heaps`.
    """
    name = dialect if isinstance(dialect, str) else dialect.name
    return _impls.get(name, QueueTableImpl)(name, cluster_heaps=cluster_heaps)
