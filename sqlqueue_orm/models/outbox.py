"""OutboxData: the outbox table, column-compatible with NServiceBus SQL persistence.

=================== ============================== ===================== ==================
column              SQL Server                     PostgreSQL            SQLite
=================== ============================== ===================== ==================
MessageId           nvarchar(200) PK NONCLUSTERED  varchar(200) PK       VARCHAR(200) PK
Dispatched          bit NOT NULL DEFAULT 0         boolean DEFAULT false BOOLEAN DEFAULT 0
DispatchedAt        datetime NULL (UTC)            timestamp NULL (UTC)  DATETIME (UTC text)
PersistenceVersion  varchar(23) NOT NULL           varchar(23)           VARCHAR(23)
Operations          nvarchar(max) NOT NULL         text                  TEXT
=================== ============================== ===================== ==================

Indexes: ``Index_DispatchedAt (DispatchedAt) WHERE Dispatched = 1`` as NServiceBus creates it
(cleanup deletes by it), and ours, ``Index_Pending (DispatchedAt) WHERE Dispatched = 0``: a tiny
index of the records still to dispatch, which the dispatcher claims by.

While a record is not dispatched, ``DispatchedAt`` holds when it was stored (or, after a failed
dispatch, when it may next be tried): the dispatcher claims records whose ``DispatchedAt`` is
older than its grace period. NServiceBus leaves ``DispatchedAt`` NULL until it dispatches and
never reads it before, so its endpoints work on this table unchanged; records it wrote (NULL
``DispatchedAt``) are never claimed by our dispatcher, only re-dispatched by NServiceBus itself.

``Operations`` is a JSON array in NServiceBus's ``SerializableOperation`` shape, documented in
:mod:`sqlqueue_orm.sending.outbox_records`.
"""

from __future__ import annotations

import datetime as dt
import functools

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base, table_of

#: Operations: nvarchar(max) on SQL Server (UnicodeText would render the deprecated NTEXT).
OPERATIONS_TYPE = sa.Text().with_variant(sa.NVARCHAR(), "mssql")
#: Name of the table, as NServiceBus SQL persistence names it with an empty prefix.
TABLE_NAME = "OutboxData"


class OutboxData(Base):
    """One handled message (or unit of work) and the messages it sends."""

    __tablename__ = TABLE_NAME

    message_id: Mapped[str] = mapped_column("MessageId", sa.Unicode(200), nullable=False)
    dispatched: Mapped[bool] = mapped_column(
        "Dispatched",
        sa.Boolean(create_constraint=False),
        nullable=False,
        server_default=sa.false(),
        default=False,
    )
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(
        "DispatchedAt", sa.DateTime(), nullable=True
    )
    persistence_version: Mapped[str] = mapped_column(
        "PersistenceVersion", sa.String(23), nullable=False
    )
    operations: Mapped[str] = mapped_column("Operations", OPERATIONS_TYPE, nullable=False)

    __table_args__ = (sa.PrimaryKeyConstraint("MessageId", mssql_clustered=False),)

    def __repr__(self) -> str:
        return f"OutboxData(message_id={self.message_id!r}, dispatched={self.dispatched!r})"


def _filtered_index(name: str, dispatched: bool) -> sa.Index:
    table = OutboxData.__table__
    condition = table.c.Dispatched == (sa.true() if dispatched else sa.false())
    return sa.Index(
        name,
        table.c.DispatchedAt,
        mssql_clustered=False,
        mssql_where=condition,
        postgresql_where=condition,
        sqlite_where=condition,
    )


#: NServiceBus's cleanup index: dispatched records by age.
INDEX_DISPATCHED_AT = _filtered_index("Index_DispatchedAt", dispatched=True)
#: Ours: records still to dispatch, by when they become due.
INDEX_PENDING = _filtered_index("Index_Pending", dispatched=False)


#: The :class:`~sqlalchemy.Table` of :class:`OutboxData`.
outbox_table = functools.partial(table_of, OutboxData)
