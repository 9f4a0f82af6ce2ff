"""sqlqueue_failure_groups: the grouping keys of failed messages (error-queue failure groups).

One row per message of an error queue: the queue's address and the row's ``Id`` (primary key),
the group ids and their texts, the time of failure. Declared once, as
:class:`sqlqueue_orm.models.failure_group.FailureGroupEntry`; created on every dialect.
Idempotent, online and offline: a table the groups already created on first use is left alone.
Downgrade drops the table (its rows are recomputed from the error queue when needed).

Revision ID: 0013_failure_groups
Revises: 0012_rate_limits
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared
from sqlqueue_orm.models import failure_group

revision = "0013_failure_groups"
down_revision: str | None = "0012_rate_limits"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = failure_group.failure_group_table()
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
    op.drop_table(failure_group.TABLE_NAME)
