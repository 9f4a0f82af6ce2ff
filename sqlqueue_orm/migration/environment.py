"""The Alembic environment of sqlqueue_orm: the Config ``sqlqueue migrate`` builds, and the run.

:func:`alembic_config` builds an Alembic Config on the scripts shipped in the package (no
checkout, no ``alembic.ini``); what a run reads from it (URL, ``-x`` arguments, version table,
target metadata) is :mod:`~sqlqueue_orm.migration.configuration`, and the run itself (online,
the sweep, offline scripts) is :mod:`~sqlqueue_orm.migration.runner`. :func:`run_migrations` is
here too, for ``env.py`` files that import it from this module.
"""

from __future__ import annotations

import importlib.resources
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

import sqlalchemy as sa

from sqlqueue_orm.migration import runner

if TYPE_CHECKING:
    from alembic.config import Config


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


def run_migrations() -> None:
    """Run the migrations Alembic asked for (:func:`.runner.run_migrations`), from ``env.py``."""
    runner.run_migrations()
