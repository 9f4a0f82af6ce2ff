"""Alembic environment shipped in the package: everything is in sqlqueue_orm.migration."""

from sqlqueue_orm.migration.runner import run_migrations

run_migrations()
