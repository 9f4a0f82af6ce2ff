"""OutboxData: the transactional outbox, column-compatible with NServiceBus SQL persistence.

Idempotent: the table and each index are created only if missing, so a database where
NServiceBus (or ``Outbox.create_table()``) already made ``OutboxData`` upgrades cleanly and only
gains the ``Index_Pending`` index the dispatcher claims by. Offline (``--sql``) it emits the
CREATE statements unconditionally. Downgrade drops the table.

Revision ID: 0005_outbox_data
Revises: 0004_rowversion_layout
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mssql

revision = "0005_outbox_data"
down_revision = "0004_rowversion_layout"
branch_labels = None
depends_on = None

TABLE = "OutboxData"


def _where(dispatched: bool) -> dict[str, object]:
    condition = sa.column("Dispatched", sa.Boolean()) == (sa.true() if dispatched else sa.false())
    return {"mssql_where": condition, "postgresql_where": condition, "sqlite_where": condition}


def upgrade() -> None:
    offline = op.get_context().as_sql
    inspector = None if offline else sa.inspect(op.get_bind())
    if inspector is None or not inspector.has_table(TABLE):
        op.create_table(
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
            sa.Column(
                "Operations", sa.Text().with_variant(mssql.NVARCHAR(), "mssql"), nullable=False
            ),
            sa.PrimaryKeyConstraint("MessageId", name="pk_OutboxData", mssql_clustered=False),
        )
        existing: set[str] = set()
    else:
        existing = {str(index["name"]) for index in inspector.get_indexes(TABLE)}
    for name, dispatched in (("Index_DispatchedAt", True), ("Index_Pending", False)):
        if name not in existing:
            op.create_index(
                name, TABLE, ["DispatchedAt"], mssql_clustered=False, **_where(dispatched)
            )


def downgrade() -> None:
    op.drop_table(TABLE)
