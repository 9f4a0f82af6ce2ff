"""What every migration run reads from its Alembic Config: URL, target, version table, metadata.

Both entries (``sqlqueue migrate`` and ``alembic`` with an ``env.py`` of ours) configure their
run from here (:func:`options`, :func:`database_url`):

* URL: ``config.attributes["sqlqueue_url"]`` (set by ``sqlqueue migrate``), else ``-x url=...``,
  else ``$SQLQUEUE_URL``, else ``sqlalchemy.url`` of ``alembic.ini``.
* ``-x schema=a,b`` (``--schema``): the schemas queue tables are looked for in (default: the
  connection's default schema). ``-x queues=q1,q2`` (``--queues``): only these queue tables.
* ``-x cluster_heaps=true`` (``--cluster-heaps``): on SQL Server, rebuild heap queue tables (the
  NServiceBus 8+ layout) with a clustered Index_RowVersion; without it a heap is kept.
* A ``Connection`` in ``config.attributes["connection"]`` is used as it is (Alembic's cookbook
  recipe; SQLite ATTACHed schemas are reached that way); an ``Engine`` there (pytest-alembic's
  way) lends one connection for the run.
* Our lineage lives in its own version table, ``sqlqueue_alembic_version``, with branch label
  ``sqlqueue_orm``, so it sits beside the application's own Alembic history.
* ``target_metadata`` is :data:`sqlqueue_orm.models.Base.metadata` with :data:`MODEL_MODULES`
  imported: ``alembic check`` compares the shared tables; queue tables (by column signature) and
  tables that are not ours are left out, so autogenerate never proposes dropping them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import exceptions, models, schema
from sqlqueue_orm.migration import discovery, operations

if TYPE_CHECKING:
    from alembic.config import Config

#: Alembic version table of sqlqueue_orm's lineage.
VERSION_TABLE = "sqlqueue_alembic_version"
#: Branch label of the root revision.
BRANCH = "sqlqueue_orm"

#: Modules declaring the shared tables on :data:`~sqlqueue_orm.models.Base.metadata`, imported by
#: name so that the core never imports an optional part (import-linter forbids
#: ``sqlqueue_orm.contrib`` here): contrib's models need no optional dependency to import.
MODEL_MODULES = (
    "sqlqueue_orm.models",  # OutboxData
    "sqlqueue_orm.contrib.spark.models",  # SparkSendLedger
)


def shared_metadata() -> sa.MetaData:
    """Base.metadata with every module of :data:`MODEL_MODULES` imported (all shared tables)."""
    for name in MODEL_MODULES:
        importlib.import_module(name)
    return models.Base.metadata


def database_url(config: Config, x_arguments: Mapping[str, str]) -> str:
    """The run's URL: ``sqlqueue migrate``'s, ``-x url``, ``$SQLQUEUE_URL``, ``alembic.ini``."""
    url = (
        config.attributes.get("sqlqueue_url")
        or x_arguments.get("url")
        or os.environ.get("SQLQUEUE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise exceptions.ConfigurationError(
            "no database URL: pass -x url=..., set SQLQUEUE_URL, or set sqlalchemy.url in "
            "alembic.ini"
        )
    return str(url)


def _target(config: Config, x_arguments: Mapping[str, str]) -> discovery.Target:
    schemas = list(config.attributes.get("sqlqueue_schemas") or [])
    queues = list(config.attributes.get("sqlqueue_queues") or [])
    if "schema" in x_arguments:
        schemas.append(x_arguments["schema"])
    if "queues" in x_arguments:
        queues.append(x_arguments["queues"])
    cluster_heaps = bool(config.attributes.get("sqlqueue_cluster_heaps")) or (
        x_arguments.get("cluster_heaps", "").strip().lower() in ("1", "true", "yes", "on")
    )
    return discovery.Target.parse(schemas, queues, cluster_heaps)


def _include_object(
    metadata: sa.MetaData,
) -> Any:
    shared = {(table.schema, table.name) for table in metadata.tables.values()}

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        if type_ != "table":
            return True
        if schema.QUEUE_SIGNATURE <= {str(column.name) for column in obj.columns}:
            return False  # a queue table: ours to upgrade, never autogenerate's to drop
        return not reflected or (obj.schema, name) in shared

    return include_object


def _include_name(metadata: sa.MetaData) -> Any:
    shared = {table.name for table in metadata.tables.values()}

    def include_name(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
        return type_ != "table" or name in shared

    return include_name


def options(config: Config, x_arguments: Mapping[str, str]) -> dict[str, Any]:
    """The ``context.configure()`` options every run shares (version table, target, filters).

    :param x_arguments: Alembic's ``-x`` arguments, as a dictionary.
    """
    metadata = shared_metadata()
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "transaction_per_migration": True,
        "include_object": _include_object(metadata),
        "include_name": _include_name(metadata),
        "compare_type": True,
        operations.TARGET_OPTION: _target(config, x_arguments),
    }
