"""OutboxData: the transactional outbox, column-compatible with NServiceBus SQL persistence.

Idempotent, online and offline (the script guards each statement on the server): the table
and each index are created only if missing, so a database where NServiceBus (or
``Outbox.create_table()``) already made ``OutboxData`` upgrades cleanly and only gains the
``Index_Pending`` index the dispatcher claims by. Downgrade drops the table.

Revision ID: 0005_outbox_data
Revises: 0004_rowversion_layout
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mssql

from sqlqueue_orm.migration import shared

revision = "0005_outbox_data"
down_revision = "0004_rowversion_layout"
branch_labels = None
depends_on = None

TABLE = "OutboxData"


def _where(dispatched: bool) -> dict[str, object]:
    condition = sa.column("Dispatched", sa.Boolean()) == (sa.true() if dispatched else sa.false())
    return {"mssql_where": condition, "postgresql_where": condition, "sqlite_where": condition}


def upgrade() -> None:
    shared.create_table_if_missing(
        TABLE,
        sa.Column("MessageId", sa.Unicode(200), nullable=False),
        sa.Column(
            "Dispatched",
            sa.Boolean(create_constraint=False),
            nullable=False,
            server_default=sa.false(),
        ),
        sa.Column("DispatchedAt", sa.DateTime(), nullable=True),
        sa.Column("PersistenceVersion", sa.String(23), nullable=False),
        sa.Column("Operations", sa.Text().with_variant(mssql.NVARCHAR(), "mssql"), nullable=False),
        sa.PrimaryKeyConstraint("MessageId", name="pk_OutboxData", mssql_clustered=False),
    )
    for name, dispatched in (("Index_DispatchedAt", True), ("Index_Pending", False)):
        shared.create_index_if_missing(
            name, TABLE, ["DispatchedAt"], mssql_clustered=False, **_where(dispatched)
        )


def downgrade() -> None:
    op.drop_table(TABLE)
