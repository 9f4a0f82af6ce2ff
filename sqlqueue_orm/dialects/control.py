"""Live control's statements on one database: the upserts of an endpoint's control row.

:class:`ControlStatements` is the group :attr:`~sqlqueue_orm.dialects.base.DialectSupport.control`
holds; :mod:`sqlqueue_orm.control` (pause, resume, a concurrency override) runs them in the
caller's transaction. :data:`CONTROL_UPSERTS` is the group of every database with
``INSERT ... ON CONFLICT`` (PostgreSQL, SQLite); SQL Server's is in
:mod:`~sqlqueue_orm.dialects.mssql`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControlStatements:
    """Upserts of one endpoint's control row, one change at a time, in the caller's transaction.

    ``{table}`` is the control table quoted by SQLAlchemy; both take ``:endpoint``,
    ``:changed_at`` and ``:changed_by``. Two operators changing one endpoint at once both
    succeed, the later commit winning; neither fails on the other's insert.
    """

    #: Set ``paused`` to ``:paused``, inserting the row (no concurrency override) if missing.
    set_paused: str
    #: Set ``concurrency`` to ``:concurrency`` (NULL: the configured one), inserting the row
    #: (not paused) if missing.
    set_concurrency: str


#: The upserts where ``INSERT ... ON CONFLICT`` exists (PostgreSQL, SQLite).
CONTROL_UPSERTS = ControlStatements(
    set_paused=(
        "INSERT INTO {table} (endpoint, paused, concurrency, changed_at, changed_by) "
        "VALUES (:endpoint, :paused, NULL, :changed_at, :changed_by) "
        "ON CONFLICT (endpoint) DO UPDATE SET paused = excluded.paused, "
        "changed_at = excluded.changed_at, changed_by = excluded.changed_by"
    ),
    set_concurrency=(
        "INSERT INTO {table} (endpoint, paused, concurrency, changed_at, changed_by) "
        "VALUES (:endpoint, :paused, :concurrency, :changed_at, :changed_by) "
        "ON CONFLICT (endpoint) DO UPDATE SET concurrency = excluded.concurrency, "
        "changed_at = excluded.changed_at, changed_by = excluded.changed_by"
    ),
)
