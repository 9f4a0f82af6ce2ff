"""sqlqueue_rate_limits: the shared schedules of the endpoints' rate limits (flow control).

One row per rate-limited queue: ``name`` (the queue's address, primary key) and ``next_at``
(double precision: when the next message may start). Declared once, as
:class:`sqlqueue_orm.models.rate_limit.RateLimitSchedule`; created on every dialect (SQLite
keeps its schedules in the process but gets the same schema). Idempotent, online and offline: a
table an endpoint already created at start-up is left alone. Downgrade drops the table.

Revision ID: 0012_rate_limits
Revises: 0011_queue_storage
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared
from sqlqueue_orm.models import rate_limit

revision = "0012_rate_limits"
down_revision: str | None = "0011_queue_storage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = rate_limit.rate_limit_table()
    shared.create_table_if_missing(
        table.name,
        *(
            sa.Column(column.name, column.type, nullable=column.nullable)
            for column in table.columns
        ),
        sa.PrimaryKeyConstraint(
            *(column.name for column in table.primary_key.columns),
            name=table.primary_key.name,
        ),
    )


def downgrade() -> None:
    op.drop_table(rate_limit.TABLE_NAME)
