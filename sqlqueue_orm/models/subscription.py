"""SubscriptionRouting: who subscribed to which topic, as NServiceBus's native pub/sub stores it.

============ ========================= ===================== ==================
column       SQL Server                PostgreSQL            SQLite
============ ========================= ===================== ==================
QueueAddress nvarchar(200) NOT NULL    queueaddress          VARCHAR(200)
                                       varchar(200) NOT NULL NOT NULL
Endpoint     nvarchar(200) NOT NULL PK endpoint varchar(200) VARCHAR(200) PK
Topic        nvarchar(200) NOT NULL PK topic varchar(200)    VARCHAR(200) PK
============ ========================= ===================== ==================

Exactly the table the .NET transport's installer creates (``CreateSubscriptionTableText`` in
``SqlServerConstants.cs`` and ``PostgreSqlConstants.cs``, Particular/NServiceBus.SqlServer
214c4e8f): ``PRIMARY KEY CLUSTERED (Endpoint, Topic)`` on SQL Server, unquoted (so lower-case)
columns and ``WITH (fillfactor=100)`` on PostgreSQL, primary keys named by the database. One
row per (subscribing endpoint, topic); ``QueueAddress`` is where that endpoint's copies go, in
the address form of the database's .NET transport (``sales@[dbo]@[shop]``, ``"public"."sales"``);
``Topic`` is the event's full .NET type name (``Type.FullName``). Every endpoint of a system
shares one table: ``[dbo].[SubscriptionRouting]`` / ``"public"."SubscriptionRouting"`` unless
configured otherwise.

Like queue tables, it has a layout per dialect and a configurable name, so it lives in a
:class:`~sqlalchemy.MetaData` of its own (one per dialect and name), not in ``Base.metadata``;
revision ``0010_subscription_routing`` creates it.
"""

from __future__ import annotations

import dataclasses
import threading

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine

from sqlqueue_orm import config, dialects

#: NServiceBus's default table name (``SubscriptionOptions.SubscriptionTableName``).
TABLE_NAME = config.SUBSCRIPTION_TABLE
#: Length of each column (NServiceBus: 200).
COLUMN_LENGTH = 200

_tables: dict[tuple[str, str | None, str], sa.Table] = {}
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Subscription:
    """One row: *endpoint* receives events of *topic* at *queue_address*."""

    queue_address: str
    endpoint: str
    topic: str


def subscription_table(
    dialect: str | Dialect | Engine | Connection | None,
    schema: str | None = None,
    name: str = TABLE_NAME,
) -> sa.Table:
    """The subscription :class:`~sqlalchemy.Table` in *dialect*'s layout (cached).

    Columns are keyed ``queue_address``, ``endpoint`` and ``topic`` on every dialect
    (``table.c.topic`` is ``Topic`` on SQL Server, ``topic`` on PostgreSQL).
    """
    support = dialects.for_dialect(dialect)
    key = (support.name, schema, name)
    with _lock:
        table = _tables.get(key)
        if table is not None:
            return table
        queue_address, endpoint, topic = support.subscription_columns
        text = sa.Unicode(COLUMN_LENGTH)  # nvarchar on SQL Server, varchar elsewhere
        table = sa.Table(
            name,
            sa.MetaData(),
            sa.Column(queue_address, text, key="queue_address", nullable=False),
            sa.Column(endpoint, text, key="endpoint", nullable=False),
            sa.Column(topic, text, key="topic", nullable=False),
            # Unnamed, as NServiceBus creates it (the database names it).
            sa.PrimaryKeyConstraint("endpoint", "topic", mssql_clustered=True),
            schema=schema,
            postgresql_with={"fillfactor": 100},
        )
        _tables[key] = table
        return table
