"""The databases a run uses: a SQLite file and a throwaway PostgreSQL cluster (or your own).

PostgreSQL: ``$SQLQUEUE_BENCH_POSTGRES_URL`` (a SQLAlchemy ``postgresql+psycopg://`` URL) or a
cluster started from the installed binaries by ``testsupport/pg_cluster.py`` (fsync off: it is
thrown away, and the peers run on the same server, so the comparison stays fair). Each database
gets a fresh database (PostgreSQL) or file (SQLite) per run.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import tempfile
import uuid
from typing import Any

import sqlalchemy as sa


@dataclasses.dataclass(frozen=True)
class Database:
    """One database under test: its SQLAlchemy URL and how the raw driver connects to it."""

    name: str  # "sqlite" or "postgresql"
    url: str
    label: str

    @property
    def raw_dsn(self) -> str:
        """The psycopg conninfo URL, or the SQLite file path."""
        if self.name == "sqlite":
            return sa.make_url(self.url).database or ""
        return self.url.replace("postgresql+psycopg://", "postgresql://", 1)

    def raw_connect(self, autocommit: bool) -> Any:
        """A DB-API connection set up the way our engines set theirs up (same pragmas)."""
        if self.name == "sqlite":
            connection = sqlite3.connect(self.raw_dsn, isolation_level=None, timeout=30)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA busy_timeout=30000")
            return connection
        import psycopg

        return psycopg.connect(self.raw_dsn, autocommit=autocommit)


def sqlite(directory: str) -> Database:
    """A SQLite file in *directory* (WAL, ``synchronous=NORMAL``, as ``db.create_engine``)."""
    path = os.path.join(directory, "bench.db")
    return Database("sqlite", f"sqlite:///{path}", "SQLite (file, WAL, synchronous=NORMAL)")


def postgresql() -> Database:
    """A new database on ``$SQLQUEUE_BENCH_POSTGRES_URL`` or on a throwaway cluster."""
    url = os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL")
    label = "PostgreSQL (psycopg 3, loopback TCP)"
    if not url:
        from testsupport import pg_cluster

        url = pg_cluster.start().url()
        label = "PostgreSQL (throwaway cluster, fsync off, psycopg 3, loopback TCP)"
    server = sa.make_url(url)
    name = f"sqlqueue_bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()
    return Database("postgresql", server.set(database=name).render_as_string(False), label)


def temporary_directory() -> tempfile.TemporaryDirectory[str]:
    """Where the SQLite file lives for the run."""
    return tempfile.TemporaryDirectory(prefix="sqlqueue-bench-")
