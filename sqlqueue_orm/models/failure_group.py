"""FailureGroupEntry: the grouping keys of each failed message, computed once (recoverability).

================== ========================= ===================== ==================
column             SQL Server                PostgreSQL            SQLite
================== ========================= ===================== ==================
id                 uniqueidentifier PK       uuid PK               CHAR(32) PK
queue              nvarchar(400) PK          varchar(400) PK       VARCHAR(400) PK
message_id         nvarchar(450) NULL        varchar(450) NULL     VARCHAR(450)
exception_type     nvarchar(450) NULL        varchar(450) NULL     VARCHAR(450)
stack_group        varchar(16) NOT NULL      varchar(16) NOT NULL  VARCHAR(16)
stack_label        nvarchar(450) NOT NULL    varchar(450) NOT NULL VARCHAR(450)
endpoint           nvarchar(450) NULL        varchar(450) NULL     VARCHAR(450)
endpoint_group     varchar(16) NOT NULL      varchar(16) NOT NULL  VARCHAR(16)
message_type       nvarchar(450) NULL        varchar(450) NULL     VARCHAR(450)
message_type_group varchar(16) NOT NULL      varchar(16) NOT NULL  VARCHAR(16)
failed_at          datetime NULL             timestamp NULL        DATETIME
================== ========================= ===================== ==================

One row per message of an error queue (``id`` is the row's native ``Id``, ``queue`` the error
queue's address as text; the key is both, in that order), written by our endpoints in the
transaction that moves the message to the error queue
(:mod:`sqlqueue_orm.receiving.failure_entries`), and for rows others write the first time the
groups are asked for after the message arrived: messages without an entry are found by comparing
ids (never by a "highest RowVersion seen", since identity values commit out of order) and
entries whose message is gone are deleted then. The ``*_group`` columns are the group ids
(:mod:`sqlqueue_orm.recoverability.groups` says how they are made); the texts are cut at 450
characters and only shown. ``failed_at`` is ``NServiceBus.TimeOfFailure`` in UTC, naive. The
table is created when an endpoint starts with ``create_queues``, or on first use when missing;
revision ``0013_failure_groups`` creates it for databases migrated with Alembic.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base, table_of

#: Name of the table.
TABLE_NAME = "sqlqueue_failure_groups"
#: Longest text stored (nvarchar(450): 900 bytes, SQL Server's key limit).
TEXT_LENGTH = 450
#: Longest error-queue address (the key, with the 16-byte id, stays within SQL Server's 900 bytes).
QUEUE_LENGTH = 400
#: Length of a group id (hex digits).
GROUP_LENGTH = 16


class FailureGroupEntry(Base):
    """The grouping keys of one failed message."""

    __tablename__ = TABLE_NAME

    # The message's id first: a message's entry is found by it.
    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True)
    queue: Mapped[str] = mapped_column(sa.Unicode(QUEUE_LENGTH), primary_key=True)
    message_id: Mapped[str | None] = mapped_column(sa.Unicode(TEXT_LENGTH), nullable=True)
    exception_type: Mapped[str | None] = mapped_column(sa.Unicode(TEXT_LENGTH), nullable=True)
    stack_group: Mapped[str] = mapped_column(sa.String(GROUP_LENGTH), nullable=False)
    stack_label: Mapped[str] = mapped_column(sa.Unicode(TEXT_LENGTH), nullable=False)
    endpoint: Mapped[str | None] = mapped_column(sa.Unicode(TEXT_LENGTH), nullable=True)
    endpoint_group: Mapped[str] = mapped_column(sa.String(GROUP_LENGTH), nullable=False)
    message_type: Mapped[str | None] = mapped_column(sa.Unicode(TEXT_LENGTH), nullable=True)
    message_type_group: Mapped[str] = mapped_column(sa.String(GROUP_LENGTH), nullable=False)
    failed_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(), nullable=True)

    def __repr__(self) -> str:
        return f"FailureGroupEntry(queue={self.queue!r}, id={self.id!r})"


#: The :class:`~sqlalchemy.Table` of :class:`FailureGroupEntry`.
failure_group_table = functools.partial(table_of, FailureGroupEntry)
