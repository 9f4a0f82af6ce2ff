"""A revision's offline T-SQL, as ``alembic upgrade --sql`` writes it for SQL Server."""

from __future__ import annotations

import importlib
import io

from alembic.migration import MigrationContext
from alembic.operations import Operations


def revision_statements(revision: str) -> list[str]:
    """The statements of *revision*'s upgrade then downgrade, offline on SQL Server.

    :param revision: the module under ``sqlqueue_orm.migrations_versions``
        (``"0014_endpoint_health"``); the script is split at its ``GO`` lines.
    """
    module = importlib.import_module(f"sqlqueue_orm.migrations_versions.{revision}")
    output = io.StringIO()
    context = MigrationContext.configure(
        dialect_name="mssql", opts={"as_sql": True, "output_buffer": output}
    )
    with Operations.context(context):
        module.upgrade()
        module.downgrade()
    return [part.strip() for part in output.getvalue().split("GO") if part.strip()]
