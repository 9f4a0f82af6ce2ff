"""EndpointHeartbeat and QueueMetricSample: what running endpoints say about themselves.

``sqlqueue_endpoints``, one row per endpoint instance (a process running an endpoint),
rewritten on every heartbeat:

================== ===================== ===================== ==================
column             SQL Server            PostgreSQL            SQLite
================== ===================== ===================== ==================
instance_id        nvarchar(48) PK       varchar(48) PK        VARCHAR(48) PK
endpoint           nvarchar(450)         varchar(450)          VARCHAR(450)
host               nvarchar(255)         varchar(255)          VARCHAR(255)
process_id         int                   integer               INTEGER
state              nvarchar(16)          varchar(16)           VARCHAR(16)
started_at         float(53)             double precision      DOUBLE
last_seen          float(53)             double precision      DOUBLE
beat_interval      float(53)             double precision      DOUBLE
concurrency        int                   integer               INTEGER
in_flight          int                   integer               INTEGER
processed          bigint                bigint                BIGINT
failed             bigint                bigint                BIGINT
processed_rate     float(53)             double precision      DOUBLE
failed_rate        float(53)             double precision      DOUBLE
================== ===================== ===================== ==================

``sqlqueue_queue_metrics``, one row per queue, instance and sample (about one a minute):

============== ===================== ===================== ==================
column         SQL Server            PostgreSQL            SQLite
============== ===================== ===================== ==================
queue          nvarchar(390) PK      varchar(390) PK       VARCHAR(390) PK
sampled_at     float(53) PK          double precision PK   DOUBLE PK
instance_id    nvarchar(48) PK       varchar(48) PK        VARCHAR(48) PK
depth          bigint NULL           bigint NULL           BIGINT NULL
oldest_age     float(53) NULL        double precision NULL DOUBLE NULL
processed      bigint                bigint                BIGINT
failed         bigint                bigint                BIGINT
============== ===================== ===================== ==================

Times are seconds since 1970 by the writer's clock (``time.time()``), as the rate limit's
schedule keeps them; ``state`` is ``running`` or ``stopped`` (a stale instance is one still
``running`` whose ``last_seen`` is more than a few beats old). A sample's ``processed`` and
``failed`` count what its instance did since its previous sample, so readers sum them;
``depth`` (the peek's estimate) and ``oldest_age`` (seconds the head message had waited since
its ``NServiceBus.TimeSent``) are readings, so readers take the latest. The metrics key
``(queue, sampled_at, instance_id)`` is 884 bytes at most on SQL Server, under its 900-byte
limit of a clustered key: queue addresses longer than 390 characters get no samples. An index
on ``sampled_at`` lets the pruning of old samples find them without reading the others.
An endpoint with heartbeats creates both tables at start-up when missing; revision
``0014_endpoint_health`` creates them for databases migrated with Alembic.
"""

from __future__ import annotations

import functools

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base, table_of

#: Name of the heartbeat table.
ENDPOINTS_TABLE = "sqlqueue_endpoints"
#: Name of the queue metrics table.
METRICS_TABLE = "sqlqueue_queue_metrics"
#: Longest endpoint name stored (nvarchar(450): 900 bytes).
NAME_LENGTH = 450
#: Longest queue address sampled (the metrics key must stay under 900 bytes on SQL Server).
QUEUE_LENGTH = 390
#: Longest instance id (a UUID, or ``dashboard-`` and a UUID).
INSTANCE_LENGTH = 48


class EndpointHeartbeat(Base):
    """One endpoint instance's latest heartbeat."""

    __tablename__ = ENDPOINTS_TABLE

    instance_id: Mapped[str] = mapped_column(sa.Unicode(INSTANCE_LENGTH), primary_key=True)
    endpoint: Mapped[str] = mapped_column(sa.Unicode(NAME_LENGTH), nullable=False)
    host: Mapped[str] = mapped_column(sa.Unicode(255), nullable=False)
    process_id: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    state: Mapped[str] = mapped_column(sa.Unicode(16), nullable=False)
    started_at: Mapped[float] = mapped_column(sa.Double(), nullable=False)
    last_seen: Mapped[float] = mapped_column(sa.Double(), nullable=False)
    beat_interval: Mapped[float] = mapped_column(sa.Double(), nullable=False)
    concurrency: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    in_flight: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    processed: Mapped[int] = mapped_column(sa.BigInteger(), nullable=False)
    failed: Mapped[int] = mapped_column(sa.BigInteger(), nullable=False)
    processed_rate: Mapped[float] = mapped_column(sa.Double(), nullable=False)
    failed_rate: Mapped[float] = mapped_column(sa.Double(), nullable=False)

    def __repr__(self) -> str:
        return f"EndpointHeartbeat(endpoint={self.endpoint!r}, instance_id={self.instance_id!r})"


class QueueMetricSample(Base):
    """One instance's reading of one queue: depth, oldest message, work since its last."""

    __tablename__ = METRICS_TABLE
    # pruning deletes by age alone, across queues
    __table_args__ = (sa.Index(None, "sampled_at"),)

    queue: Mapped[str] = mapped_column(sa.Unicode(QUEUE_LENGTH), primary_key=True)
    sampled_at: Mapped[float] = mapped_column(sa.Double(), primary_key=True)
    instance_id: Mapped[str] = mapped_column(sa.Unicode(INSTANCE_LENGTH), primary_key=True)
    depth: Mapped[int | None] = mapped_column(sa.BigInteger(), nullable=True)
    oldest_age: Mapped[float | None] = mapped_column(sa.Double(), nullable=True)
    processed: Mapped[int] = mapped_column(sa.BigInteger(), nullable=False)
    failed: Mapped[int] = mapped_column(sa.BigInteger(), nullable=False)

    def __repr__(self) -> str:
        return f"QueueMetricSample(queue={self.queue!r}, sampled_at={self.sampled_at!r})"


#: The :class:`~sqlalchemy.Table` of :class:`EndpointHeartbeat`.
endpoints_table = functools.partial(table_of, EndpointHeartbeat)
#: The :class:`~sqlalchemy.Table` of :class:`QueueMetricSample`.
metrics_table = functools.partial(table_of, QueueMetricSample)
