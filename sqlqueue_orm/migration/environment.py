"""The Alembic Config ``sqlqueue migrate`` builds, and what every run configures.

The run itself (online, the sweep, offline scripts) is :mod:`~sqlqueue_orm.migration.runner`.

* URL: ``config.attributes["sqlqueue_url"]`` (set by ``sqlqueue migrate``), else ``-x url=...``,
  else ``$SQLQUEUE_URL``, else ``sqlalchemy.url`` of ``alembic.ini``.
* ``-x schema=a,b`` (``--schema``): the schemas queue tables are looked for in (default: the
  connection's default schema). ``-x queues=q1,q2`` (``--queues``): only these queue tables.
* ``-x cluster_heaps=true`` (``--cluster-heaps``): on SQL Server, rebuild heap queue tables (the
  NServiceBus 8+ layout) with a clustered Index_RowVersion; without it a heap is kept.
* A connection in ``config.attributes["connection"]`` is used as it is (Alembic's cookbook
  recipe; SQLite ATTACHed schemas are reached that way).
* Our lineage lives in its own version table, ``sqlqueue_alembic_version``, with branch label
  ``sqlqueue_orm``, so it sits beside the application's own Alembic history.
* ``target_metadata`` is :data:`sqlqueue_orm.models.Base.metadata` with :data:`MODEL_MODULES`
  imported: ``alembic check`` compares the shared tables; queue tables (by column signature) and
  tables that are not ours are left out, so autogenerate never proposes dropping them.
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import sqlalchemy as sa

from sqlqueue_orm import exceptions, schema
from sqlqueue_orm.migration import discovery, operations

if TYPE_CHECKING:
    from alembic.config import Config

#: Alembic version table of sqlqueue_orm's lineage.
VERSION_TABLE = "sqlqueue_alembic_version"
#: Branch label of the root revision.
BRANCH = "sqlqueue_orm"


def script_location() -> str:
    """The packaged Alembic script directory (``env.py``, ``script.py.mako``)."""
    return str(importlib.resources.files("sqlqueue_orm.migration.script"))


def versions_location() -> str:
    """The packaged revisions (the repository's ``migrations_versions/``)."""
    return str(importlib.resources.files("sqlqueue_orm.migrations_versions"))


def alembic_config(
    url: str | None = None,
    *,
    schemas: Iterable[str] = (),
    queues: Iterable[str] = (),
    connection: sa.engine.Connection | None = None,
    stdout: TextIO | None = None,
    cluster_heaps: bool = False,
) -> Config:
    """An Alembic Config on the packaged scripts, as ``sqlqueue migrate`` runs them.

    :param url: the database URL (else ``$SQLQUEUE_URL``).
    :param schemas: schemas to look for queue tables in (default: the default schema).
    :param queues: queue addresses to migrate (default: every queue table found).
    :param connection: run on this connection instead of opening one (not in a transaction).
    :param stdout: where offline scripts and Alembic's messages go (default: sys.stdout).
    :param cluster_heaps: SQL Server: rebuild heap queue tables clustered (default: keep them).
    """
    from alembic.config import Config

    out = stdout or sys.stdout
    config = Config(output_buffer=out, stdout=out)
    for name, value in (
        ("script_location", script_location()),
        ("version_locations", versions_location()),
        ("path_separator", "newline"),
    ):
        config.set_main_option(name, value.replace("%", "%%"))
    config.attributes["sqlqueue_url"] = url
    config.attributes["sqlqueue_schemas"] = list(schemas)
    config.attributes["sqlqueue_queues"] = list(queues)
    config.attributes["sqlqueue_cluster_heaps"] = cluster_heaps
    if connection is not None:
        config.attributes["connection"] = connection
    return config


#: Modules declaring the shared tables on :data:`~sqlqueue_orm.models.Base.metadata`, imported by
#: name so that the core never imports an optional part (import-linter forbids
#: ``sqlqueue_orm.contrib`` here): contrib's models need no optional dependency to import.
MODEL_MODULES = (
    "sqlqueue_orm.models",  # OutboxData
    "sqlqueue_orm.contrib.spark.models",  # SparkSendLedger
)


def _load_shared_models() -> sa.MetaData:
    """Base.metadata with every module of :data:`MODEL_MODULES` imported (all shared tables)."""
    import sqlqueue_orm.models as models

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
    metadata = _load_shared_models()
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "transaction_per_migration": True,
        "include_object": _include_object(metadata),
        "include_name": _include_name(metadata),
        "compare_type": True,
        operations.TARGET_OPTION: _target(config, x_arguments),
    }


def run_migrations() -> None:
    """Run the migrations Alembic asked for (kept for ``env.py`` files that import it here)."""
    from sqlqueue_orm.migration import runner

    runner.run_migrations()
