"""The queue table steps (one per revision) and what every dialect's implementation shares.

Each step is one concern, idempotent, with a downgrade. "Current" always means what
:func:`~sqlqueue_orm.models.queue_table.build_queue_table` defines, so the migrations and the
runtime installer cannot drift apart: the steps take index definitions from that model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from sqlqueue_orm import addressing, dialects, exceptions
from sqlqueue_orm.models.ddl import compile_ddl as compile_ddl
from sqlqueue_orm.models.queue_table import POSTGRESQL_COLUMNS, build_queue_table, index_name

# What a step does on one dialect is that dialect's migration class (migration/impl.py); whether
# a step applies at all is a fact of the dialect (sqlqueue_orm.dialects), asked by Step.only_on.

EXPIRES_INDEX = "Index_Expires"
ROW_VERSION_INDEX = "Index_RowVersion"
#: Columns whose presence makes a table a queue table, whatever its name (as schema.py).
SIGNATURE = ("Id", "Expires", "Headers", "Body", "RowVersion")

#: The revision that moves PostgreSQL queue tables to NServiceBus's PostgreSQL layout.
NSB_LAYOUT = "0008_postgresql_nsb_layout"
#: The revision that gives PostgreSQL queue tables their storage settings.
QUEUE_STORAGE = "0011_queue_storage"
#: The columns of that layout (unquoted lower case), by the SQL Server layout's name.
NSB_RENAMES = {
    "Id": "id",
    "Expires": "expires",
    "Headers": "headers",
    "Body": "body",
    "RowVersion": "seq",
    "BodyString": "bodystring",
}
NSB_SIGNATURE = tuple(POSTGRESQL_COLUMNS.values())

#: Names standing for "the table at hand" in statements the server-side loops fill in.
PLACEHOLDER_TABLE = "__sqlqueue_table__"
PLACEHOLDER_SCHEMA = "__sqlqueue_schema__"


@dataclasses.dataclass(frozen=True)
class Step:
    """One revision's concern: its id, what it does each way (for progress lines), where it acts.

    Each dialect's :class:`~sqlqueue_orm.migration.impl.QueueTableImpl` implements a step as the
    functions of its ``bodies`` module :meth:`method` names (``upgrade_expires_index``,
    ``downgrade_expires_index``, ...): this table is the only place a revision is tied to what
    it does.
    """

    revision: str
    #: What the step is about; names the dialects' methods implementing it.
    concern: str
    upgrade: str
    downgrade: str
    #: Which dialects the step changes anything on, by what they support (``None``: every one).
    only_on: Callable[[dialects.DialectSupport], bool] | None = None

    def describe(self, direction: str) -> str:
        """The progress text of this step in *direction* (``upgrade`` or ``downgrade``)."""
        return f"{self.revision} {direction}: {getattr(self, direction)}"

    def method(self, direction: str) -> str:
        """The name of the dialect's step body doing this step in *direction*."""
        return f"{direction}_{self.concern}"


def _has_seq_layout(support: dialects.DialectSupport) -> bool:
    return support.queue_layout is dialects.QueueLayout.SEQ


def _has_queue_storage(support: dialects.DialectSupport) -> bool:
    return bool(support.queue_storage)


STEPS = {
    step.revision: step
    for step in (
        Step(
            "0001_expires_index",
            "expires_index",
            "Index_Expires (Expires) INCLUDE (Id, RowVersion)",
            "drop Index_Expires",
        ),
        Step(
            "0002_headers_nvarchar",
            "headers_nvarchar",
            "Headers to nvarchar(max) / text NOT NULL",
            "Headers back to varchar(max) / varchar",
        ),
        Step(
            "0003_filter_expires_index",
            "filter_expires_index",
            "Index_Expires filtered WHERE Expires IS NOT NULL",
            "Index_Expires unfiltered",
        ),
        Step(
            "0004_rowversion_layout",
            "rowversion_layout",
            "RowVersion and Index_RowVersion to the current layout",
            "RowVersion and Index_RowVersion to the v1 layout",
        ),
        Step(
            NSB_LAYOUT,
            "postgresql_nsb_layout",
            "PostgreSQL: to NServiceBus's PostgreSQL layout (id ... seq)",
            "PostgreSQL: back to the SQL Server column layout (\"Id\" ... \"RowVersion\")",
            only_on=_has_seq_layout,
        ),
        Step(
            QUEUE_STORAGE,
            "queue_storage",
            "PostgreSQL: storage settings of a churning table (fillfactor, autovacuum)",
            "PostgreSQL: the server's storage defaults again",
            only_on=_has_queue_storage,
        ),
    )
}


def applies_to(revision: str, dialect_name: str) -> bool:
    """Whether step *revision* changes anything on *dialect_name*."""
    only_on = STEPS[revision].only_on
    return only_on is None or only_on(dialects.for_dialect(dialect_name))


DIRECTIONS = ("upgrade", "downgrade")


@dataclasses.dataclass(frozen=True)
class SchemaFilter:
    """How a dialect's server-side loops select the tables of some schemas: its SQL."""

    #: The condition on the named schemas, ``{}`` standing for their list.
    named: str
    #: The condition on the default schema of whoever runs the script.
    default: str
    #: The default schema, as the script's comment names it.
    default_name: str

    def select(
        self,
        schemas: Sequence[str | None],
        in_list: Callable[[list[str]], str],
        quote: Callable[[str], str],
    ) -> tuple[str, str]:
        """The condition finding the tables of *schemas*, and the schemas for the comment.

        ``None`` in *schemas* (or no schema named) stands for the default schema;
        *in_list* renders the named ones' list, *quote* one name.
        """
        names = [schema for schema in schemas if schema is not None]
        conditions = [self.named.format(in_list(names))] if names else []
        if None in schemas or not names:
            conditions.append(self.default)
        described = ", ".join(
            self.default_name if schema is None else quote(schema) for schema in schemas
        )
        return " OR ".join(conditions), described


def step(revision: str, direction: str) -> Step:
    """The step of *revision*; raise :class:`ConfigurationError` naming an unknown one."""
    if direction not in DIRECTIONS:
        raise exceptions.ConfigurationError(f"unknown migration direction {direction!r}")
    try:
        return STEPS[revision]
    except KeyError:
        raise exceptions.ConfigurationError(
            f"unknown queue table step {revision!r}; known: {', '.join(STEPS)}"
        ) from None


def model_table(address: addressing.QueueAddress) -> sa.Table:
    """The current queue table of *address*, in a throw-away MetaData."""
    if address.catalog is not None:
        raise exceptions.ConfigurationError(
            f"queue {str(address)!r} names catalog {address.catalog!r}; migrate each database "
            "by connecting to it"
        )
    return build_queue_table(sa.MetaData(), address.table, address.schema)


def index_filter(index: sa.Index, dialect: Dialect) -> str:
    """The ``WHERE`` of filtered *index* as *dialect* compiles it, its columns unqualified."""
    where = dialects.for_dialect(dialect).options_of(index)["where"]
    return str(where.compile(dialect=dialect, compile_kwargs={"include_table": False}))


def model_index(table: sa.Table, base: str, dialect_name: str) -> sa.Index:
    """The model's index *base* (``Index_Expires``, ``Index_RowVersion``) for *dialect_name*."""
    wanted = index_name(str(table.name), base, dialect_name)
    support = dialects.for_dialect(dialect_name)
    for index in table.indexes:
        if index.name == wanted and support.creates(index):
            return index
    raise LookupError(f"the queue table model has no {base} on {dialect_name}")
