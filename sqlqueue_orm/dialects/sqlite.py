"""SQLite: the embedded default; ``BEGIN IMMEDIATE`` serializes writers, so no locks or hints."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import sqlite

from sqlqueue_orm.dialects import base

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect, Engine

#: Seconds a writer waits for the write lock before "database is locked".
BUSY_TIMEOUT_S = 30
#: Every transaction takes the write lock up front: writers queue up on the busy timeout
#: instead of failing with "database is locked" when a reader upgrades.
BEGIN = "BEGIN IMMEDIATE"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SqliteSupport(base.DialectSupport):
    """SQLite: WAL mode and ``BEGIN IMMEDIATE`` set up on every engine."""

    def create_engine(
        self, url: sa.URL, *, sqlite_synchronous: str = "NORMAL", **kwargs: Any
    ) -> Engine:
        """An engine in WAL mode whose transactions begin with :data:`BEGIN`.

        :param sqlite_synchronous: ``PRAGMA synchronous`` for file databases (checked by
            :func:`sqlqueue_orm.db.create_engine`: one of four words).
        """
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("timeout", BUSY_TIMEOUT_S)
        connect_args.setdefault("check_same_thread", False)
        # Turn off pysqlite's own transaction handling: we emit BEGIN ourselves (below), which
        # also makes DDL transactional and SAVEPOINT work (SQLAlchemy's documented recipe).
        connect_args["isolation_level"] = None
        engine = sa.create_engine(url, **kwargs)
        _setup(engine, url.database in (None, "", ":memory:"), sqlite_synchronous)
        return engine

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """SQLite's dialect (*target_version* is for SQL Server only)."""
        return sqlite.dialect(paramstyle="named")


def _setup(engine: Engine, in_memory: bool, synchronous: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute(f"PRAGMA synchronous={synchronous}")  # one of four words
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Straight to the driver: this runs once per transaction, on the hot path.
        connection.connection.driver_connection.execute(BEGIN)  # type: ignore[union-attr]


SUPPORT = SqliteSupport(
    name="sqlite",
    identifier_limit=1024,
    begin=BEGIN,
    embedded=True,
    single_writer=True,
    missing_table_markers=("no such table",),
    missing_column_markers=("no such column", "has no column named"),
    transient_markers=(*base.GENERIC_TRANSIENT, "database is locked"),
)
