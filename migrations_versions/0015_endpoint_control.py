"""sqlqueue_endpoint_control and sqlqueue_control_log: live control of endpoints, and its log.

One control row per endpoint (``endpoint``, primary key; ``paused``; ``concurrency``, NULL for
the configured one; ``changed_at``, ``changed_by``), and one log row per change (``id``, an
identity; ``endpoint``, indexed; ``action``, ``at``, ``host``, ``os_user``, ``client``).
Declared once, as :class:`sqlqueue_orm.models.endpoint_control.EndpointControl` and
:class:`~sqlqueue_orm.models.endpoint_control.ControlAction`. Idempotent, online and offline:
tables an endpoint or the control API already created are left alone. Downgrade drops them.

Revision ID: 0015_endpoint_control
Revises: 0014_endpoint_health
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import shared
from sqlqueue_orm.models import endpoint_control

revision = "0015_endpoint_control"
down_revision: str | None = "0014_endpoint_health"
branch_labels = None
depends_on = None


def _create(table: sa.Table) -> None:
    shared.create_table_if_missing(
        table.name,
        *(
            sa.Column(
                column.name,
                column.type,
                nullable=column.nullable,
                autoincrement=column.autoincrement,
            )
            for column in table.columns
        ),
        sa.PrimaryKeyConstraint(
            *(column.name for column in table.primary_key.columns),
            name=table.primary_key.name,
        ),
    )
    for index in table.indexes:
        shared.create_index_if_missing(
            str(index.name), table.name, [column.name for column in index.columns]
        )


def upgrade() -> None:
    _create(endpoint_control.control_table())
    _create(endpoint_control.log_table())


def downgrade() -> None:
    op.drop_table(endpoint_control.LOG_TABLE_NAME)
    op.drop_table(endpoint_control.TABLE_NAME)
