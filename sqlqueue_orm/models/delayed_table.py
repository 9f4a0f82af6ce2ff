"""The delayed table ``<endpoint>.Delayed``: messages waiting for their due time.

Exactly as NServiceBus's transport creates it (``CreateDelayedMessageStoreText`` of
``SqlServerConstants.cs`` and ``PostgreSqlConstants.cs``, Particular/NServiceBus.SqlServer):

============ ============================ =================================== ===================
column       SQL Server                   PostgreSQL                          SQLite
============ ============================ =================================== ===================
Id           (none)                       ``id uuid NOT NULL DEFAULT          (none)
                                          gen_random_uuid() PRIMARY KEY``
Headers      nvarchar(max) NOT NULL       ``headers text NOT NULL``           TEXT NOT NULL
Body         varbinary(max) NULL          ``body bytea``                      BLOB
Due          datetime NOT NULL (UTC)      ``due timestamptz NOT NULL``        DATETIME (UTC text)
RowVersion   bigint IDENTITY(1,1)         (none)                              INTEGER PRIMARY KEY
                                                                              AUTOINCREMENT
============ ============================ =================================== ===================

Index on Due: ``[Index_Due]`` (NONCLUSTERED, the table is a heap) on SQL Server, ``"<table>_Due"``
on PostgreSQL (``WITH (fillfactor=100)`` on the table), ``<table>_Index_Due`` on SQLite. The
PostgreSQL columns are unquoted lower case as the .NET transport writes them; the ``table.c``
keys stay ``Headers``, ``Body``, ``Due`` on every dialect.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa

from sqlqueue_orm import addressing, dialects
from sqlqueue_orm.models import ddl
from sqlqueue_orm.models.queue_table import (
    BODY_TYPE,
    HEADERS_TYPE,
    DialectLike,
    append_indexes,
    index_name,
    layout_of,
    only_dialect,
    row_version_column,
)

#: The default suffix of a delayed table's name: ``<endpoint>.Delayed`` (NServiceBus's
#: ``DelayedDeliveryOptions.TableSuffix``).
DEFAULT_SUFFIX = "Delayed"
#: Due: ``datetime`` on SQL Server, as NServiceBus (never datetime2).
DUE_TYPE = sa.DateTime().with_variant(sa.DATETIME(), "mssql")

#: The MetaData of each layout and the one dialect its tables are for (None: every dialect), made
#: on first use (see :func:`~sqlqueue_orm.models.queue_table.only_dialect`).
_METADATA: dict[tuple[dialects.QueueLayout, str | None], sa.MetaData] = {}
_lock = threading.Lock()


def delayed_table_name(endpoint: str, suffix: str = DEFAULT_SUFFIX) -> str:
    """The table name of *endpoint*'s delayed table: ``<endpoint>.<suffix>``."""
    if not isinstance(suffix, str) or not suffix.strip():
        raise ValueError(f"delayed table suffix {suffix!r} must not be empty")
    return f"{endpoint}.{suffix}"


def build_delayed_table(
    metadata: sa.MetaData, name: str, schema: str | None = None, dialect: DialectLike = None
) -> sa.Table:
    """Define the delayed table *name* in *metadata*, in the layout of *dialect*."""
    addressing.QueueAddress(name, schema)  # validates: not empty, no NUL
    quoted = sa.sql.elements.quoted_name(name, quote=True)
    quoted_schema = None if schema is None else sa.sql.elements.quoted_name(schema, quote=True)
    if layout_of(dialect) is dialects.QueueLayout.SEQ:
        table = sa.Table(
            quoted,
            metadata,
            sa.Column(
                "id",
                sa.Uuid(),
                primary_key=True,
                server_default=sa.text("gen_random_uuid()"),
                key="Id",
            ),
            sa.Column("headers", sa.Text(), nullable=False, key="Headers"),
            sa.Column("body", sa.LargeBinary(), nullable=True, key="Body"),
            sa.Column("due", sa.DateTime(timezone=True), nullable=False, key="Due"),
            schema=quoted_schema,
            postgresql_with={"fillfactor": 100},
        )
        table.append_constraint(sa.Index(index_name(name, "Due"), table.c.Due))
        return table
    table = sa.Table(
        quoted,
        metadata,
        sa.Column("Headers", HEADERS_TYPE, nullable=False),
        sa.Column("Body", BODY_TYPE, nullable=True),
        sa.Column("Due", DUE_TYPE, nullable=False),
        row_version_column(),
        schema=quoted_schema,
        sqlite_autoincrement=True,
    )
    # SQLite: RowVersion is the rowid. SQL Server: a heap, no primary key, as NServiceBus.
    primary_key = sa.PrimaryKeyConstraint(table.c.RowVersion, name=None)
    primary_key.ddl_if(dialect="sqlite")
    table.append_constraint(primary_key)
    append_indexes(
        table,
        [
            (("mssql",), lambda: ddl.sql_server_index(
                "Index_Due", table.c.Due, mssql_clustered=False
            )),
            (("sqlite",), lambda: sa.Index(index_name(name, "Index_Due", "sqlite"), table.c.Due)),
        ],
        dialect,
    )
    return table


def delayed_table(name: str, schema: str | None = None, dialect: DialectLike = None) -> sa.Table:
    """The cached :class:`~sqlalchemy.Table` of delayed table *name* (thread-safe)."""
    layout, only = layout_of(dialect), only_dialect(dialect)
    key = name if schema is None else f"{schema}.{name}"
    with _lock:
        metadata = _METADATA.setdefault((layout, only), sa.MetaData())
        table = metadata.tables.get(key)
        if table is None:
            table = build_delayed_table(metadata, name, schema, only or dialect)
        return table


def is_delayed_table(columns: set[str], dialect: DialectLike) -> bool:
    """Whether a table with *columns* has the delayed table's signature on *dialect*."""
    wanted = dialects.for_dialect(dialect).delayed_signature
    return set(wanted) <= columns
