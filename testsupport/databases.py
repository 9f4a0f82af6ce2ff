"""Throwaway PostgreSQL databases on a server whose user may ``CREATE DATABASE``."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Engine


def admin_engine(url: str) -> Engine:
    """An engine on the server at *url* in autocommit, as ``CREATE DATABASE`` needs."""
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def new_postgres_database(admin: Engine) -> str:
    """Create a database of a fresh name through *admin*; its URL."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    return admin.url.set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(admin: Engine, url: str) -> None:
    """Drop the database at *url*, disconnecting whoever is still on it."""
    name = sa.make_url(url).database
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
