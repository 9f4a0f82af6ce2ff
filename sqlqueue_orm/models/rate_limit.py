"""RateLimitSchedule: the shared schedule of each queue's rate limit (flow control).

======== ========================= ===================== ==================
column   SQL Server                PostgreSQL            SQLite
======== ========================= ===================== ==================
name     nvarchar(450) PK          varchar(450) PK       VARCHAR(450) PK
next_at  float(53) NOT NULL        double precision      DOUBLE NOT NULL
                                   NOT NULL
======== ========================= ===================== ==================

One row per rate-limited queue (``name`` is the queue's address as text), found by its primary
key, so a receive's check costs the same however long the queue has run. ``next_at`` is when
the next message may start, in seconds since 1970 by the server's clock: the "theoretical
arrival time" of the generic cell rate algorithm (:class:`sqlqueue_orm.receiving.flow.RateLimit`).
An endpoint with a rate limit creates the table and its row at start-up when missing; revision
``0012_rate_limits`` creates the table for databases migrated with Alembic. SQLite keeps the
schedule in the process (the table is declared on every dialect so the metadata is the same).
"""

from __future__ import annotations

import functools

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base, table_of

#: Name of the table.
TABLE_NAME = "sqlqueue_rate_limits"
#: Longest queue address stored (nvarchar(450): 900 bytes, SQL Server's key limit).
NAME_LENGTH = 450


class RateLimitSchedule(Base):
    """The schedule of one queue's rate limit."""

    __tablename__ = TABLE_NAME

    name: Mapped[str] = mapped_column(sa.Unicode(NAME_LENGTH), primary_key=True)
    # double precision: seconds since 1970 to the microsecond need 16 significant digits
    next_at: Mapped[float] = mapped_column(sa.Double(), nullable=False)

    def __repr__(self) -> str:
        return f"RateLimitSchedule(name={self.name!r}, next_at={self.next_at!r})"


#: The :class:`~sqlalchemy.Table` of :class:`RateLimitSchedule`.
rate_limit_table = functools.partial(table_of, RateLimitSchedule)
