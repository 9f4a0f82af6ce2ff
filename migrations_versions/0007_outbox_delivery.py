"""OutboxDelivery: the outbox messages this database received from another database's dispatcher.

Idempotent, online and offline: the table and its index are created only if missing (the
dispatcher creates the table itself in a destination database where this revision has not run).
Downgrade drops the table.

Revision ID: 0007_outbox_delivery
Revises: 0006_spark_send_ledger
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared

revision = "0007_outbox_delivery"
down_revision = "0006_spark_send_ledger"
branch_labels = None
depends_on = None

TABLE = "OutboxDelivery"
INDEX = "ix_OutboxDelivery_DeliveredAt"


def upgrade() -> None:
    shared.create_table_if_missing(
        TABLE,
        sa.Column("Destination", sa.Unicode(200), nullable=False),
        sa.Column("MessageId", sa.Unicode(200), nullable=False),
        sa.Column("OutboxRecordId", sa.Unicode(200), nullable=False),
        sa.Column("DeliveredAt", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("Destination", "MessageId", name="pk_OutboxDelivery"),
    )
    shared.create_index_if_missing(INDEX, TABLE, ["DeliveredAt"])


def downgrade() -> None:
    op.drop_table(TABLE)
