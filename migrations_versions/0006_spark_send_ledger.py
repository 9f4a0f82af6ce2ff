"""SparkSendLedger: the keys ``send_dataframe`` has sent, so a re-run skips them.

Idempotent, online and offline: the table and its index are created only if missing
(``send_dataframe`` creates the table itself on first keyed use when this revision has not run).
Downgrade drops the table.

Revision ID: 0006_spark_send_ledger
Revises: 0005_outbox_data
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared

revision = "0006_spark_send_ledger"
down_revision = "0005_outbox_data"
branch_labels = None
depends_on = None

TABLE = "SparkSendLedger"
INDEX = "ix_SparkSendLedger_SentAt"


def upgrade() -> None:
    shared.create_table_if_missing(
        TABLE,
        sa.Column("Destination", sa.Unicode(200), nullable=False),
        sa.Column("MessageId", sa.Unicode(200), nullable=False),
        sa.Column("SentAt", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("Destination", "MessageId", name="pk_SparkSendLedger"),
    )
    shared.create_index_if_missing(INDEX, TABLE, ["SentAt"])


def downgrade() -> None:
    op.drop_table(TABLE)
