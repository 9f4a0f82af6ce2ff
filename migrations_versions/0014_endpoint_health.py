"""sqlqueue_endpoints and sqlqueue_queue_metrics: endpoint heartbeats and queue metrics.

Declared once, as :class:`sqlqueue_orm.models.endpoint_health.EndpointHeartbeat` and
:class:`~sqlqueue_orm.models.endpoint_health.QueueMetricSample`; created on every dialect.
Idempotent, online and offline: tables an endpoint already created at start-up are left alone.
Downgrade drops both.

Revision ID: 0014_endpoint_health
Revises: 0013_failure_groups
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared
from sqlqueue_orm.models import endpoint_health

revision = "0014_endpoint_health"
down_revision: str | None = "0013_failure_groups"
branch_labels = None
depends_on = None


def _create(table: sa.Table) -> None:
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
    for index in sorted(table.indexes, key=lambda each: str(each.name)):
        shared.create_index_if_missing(
            str(index.name), table.name, [column.name for column in index.columns]
        )


def upgrade() -> None:
    _create(endpoint_health.endpoints_table())
    _create(endpoint_health.metrics_table())


def downgrade() -> None:
    op.drop_table(endpoint_health.METRICS_TABLE)
    op.drop_table(endpoint_health.ENDPOINTS_TABLE)
