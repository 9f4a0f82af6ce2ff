"""Alembic migrations of queue tables (of any NServiceBus era) and of the shared tables.

* :mod:`~sqlqueue_orm.migration.runner`: what both ``env.py`` files run (online, then the sweep
  of every queue table; offline scripts whole or not at all) and ``sqlqueue migrate``'s entry.
* :mod:`~sqlqueue_orm.migration.environment`: the Config ``sqlqueue migrate`` builds on the
  scripts shipped in the package.
* :mod:`~sqlqueue_orm.migration.configuration`: what every run reads from its Config (URL,
  ``-x`` arguments, version table, target metadata) and the options it configures.
* :mod:`~sqlqueue_orm.migration.operations`: ``op.upgrade_queue_tables(revision)`` and
  ``op.downgrade_queue_tables(revision)``, online (table by table, with progress lines) or as an
  offline script.
* :mod:`~sqlqueue_orm.migration.discovery`: which tables are queue tables (column signature).
* :mod:`~sqlqueue_orm.migration.ownership`: which tables are the library's, for an application's
  own autogenerate (:func:`sqlqueue_orm.alembic_filter`).
* :mod:`~sqlqueue_orm.migration.steps`: the step table, one step per revision, and the model
  they target.
* :mod:`~sqlqueue_orm.migration.impl`: the interface each dialect implements
  (``QueueTableImpl``), registered by ``__dialect__`` and looked up by ``impl_for(dialect)``.
* :mod:`~sqlqueue_orm.migration.tsql`, :mod:`~sqlqueue_orm.migration.plpgsql`,
  :mod:`~sqlqueue_orm.migration.sqlite`: each dialect's implementation (``MssqlImpl``,
  ``PostgresqlImpl``, ``SqliteImpl``).
* the ``sqlqueue migrate`` command is :mod:`sqlqueue_orm.cli.migrate`.

See ``docs/migrations.md``; its documented API is :func:`alembic_config`, exported here.
"""

# Each dialect's implementation registers itself when its module is imported; importing them
# with the package (as Alembic's ``ddl/__init__.py`` does) has them all registered before
# ``impl_for`` is first called, whichever module of the package is imported first.
from sqlqueue_orm.migration import plpgsql as plpgsql
from sqlqueue_orm.migration import sqlite as sqlite
from sqlqueue_orm.migration import tsql as tsql
from sqlqueue_orm.migration.environment import alembic_config

__all__ = ["alembic_config"]
