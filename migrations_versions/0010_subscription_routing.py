"""SubscriptionRouting: NServiceBus's native publish/subscribe table, in each dialect's layout.

The table NServiceBus's installer creates (``CreateSubscriptionTableText`` of
``SqlServerConstants.cs`` and ``PostgreSqlConstants.cs``): ``QueueAddress, Endpoint, Topic``,
200 characters each, primary key ``(Endpoint, Topic)`` (clustered on SQL Server; unquoted, so
lower-case, columns and ``fillfactor=100`` on PostgreSQL), in the default schema. Idempotent,
online and offline: a table a .NET endpoint (or ``Transport.create_subscription_table``) already
made is left alone. Downgrade drops the table.

Revision ID: 0010_subscription_routing
Revises: 0009_delayed_delivery
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared
from sqlqueue_orm.models import subscription

revision = "0010_subscription_routing"
down_revision: str | None = "0009_delayed_delivery"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = subscription.subscription_table(op.get_context().dialect)
    shared.create_table_if_missing(
        table.name,
        *(
            sa.Column(column.name, column.type, key=column.key, nullable=False)
            for column in table.columns
        ),
        sa.PrimaryKeyConstraint("endpoint", "topic", mssql_clustered=True),
        **table.dialect_kwargs,
    )


def downgrade() -> None:
    op.drop_table(subscription.TABLE_NAME)
