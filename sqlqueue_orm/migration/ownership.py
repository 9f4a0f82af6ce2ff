"""Which tables are sqlqueue_orm's: what an application's own autogenerate must leave alone.

An application whose Alembic ``target_metadata`` holds only its own models sees every table of
ours as one to drop. Queues are created at run time under names only the application knows, so
no static list can name them; the library recognises its tables by what it knows of them:

* the shared tables by name (the outbox, the Spark ledger, rate limits, failure groups, endpoint
  health and control: every table of :data:`~sqlqueue_orm.models.Base.metadata` with
  :data:`~sqlqueue_orm.migration.configuration.MODEL_MODULES` imported), and our version table;
* queue tables, delayed tables and subscription tables by their columns, in every dialect's
  layout (the column signatures :mod:`sqlqueue_orm.migration.discovery` and the delayed step
  find them by), whatever their names.

:func:`include_object` is the ``include_object`` hook built on that; the package exports it as
:func:`sqlqueue_orm.alembic_filter`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlqueue_orm import dialects, schema
from sqlqueue_orm.migration import configuration
from sqlqueue_orm.models import subscription
from sqlqueue_orm.models.delayed_table import is_delayed_table


def shared_table_names() -> frozenset[str]:
    """The names of the library's tables that have a fixed name (and its version table)."""
    metadata = configuration.shared_metadata()
    names = {table.name for table in metadata.tables.values()}
    return frozenset(names | {configuration.VERSION_TABLE, subscription.TABLE_NAME})


def is_library_table(name: str, columns: Iterable[str]) -> bool:
    """Whether the table *name* with *columns* is one of the library's.

    :param name: the table's name (without its schema).
    :param columns: its column names, as the database reports them.
    """
    if name in shared_table_names():
        return True
    names = {str(column) for column in columns}
    if schema.is_queue_table(names):
        return True
    return any(
        is_delayed_table(names, dialect) or names == set(support.subscription_columns)
        for dialect, support in dialects.ALL.items()
    )


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic's ``include_object`` hook: ``False`` for the library's tables, else ``True``.

    Tables on either side (in the database, or in the application's metadata) are judged alike,
    so autogenerate neither drops nor creates them; what a table holds (indexes, constraints,
    columns) is not visited once the table is left out.
    """
    if type_ != "table":
        return True
    return not is_library_table(str(name), (str(column.name) for column in obj.columns))
