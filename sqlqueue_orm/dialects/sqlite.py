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

# SQLite writes Expires as UTC text 'YYYY-MM-DD HH:MM:SS.SSS', which sorts as it compares.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_EXPIRES = (
    "CASE WHEN :ttbr IS NULL THEN NULL "
    "ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (:ttbr / 1000.0) || ' seconds') END"
)

#: The hot path: send, receive, peek, purge.
HOT_PATH = base.SqlText(
    headers_read="CAST({headers} AS BLOB)",
    send=(
        'INSERT INTO {table} ("Id", "Recoverable", "Expires", "Headers", "Body") '
        f"VALUES (:id, 1, {_EXPIRES}, :headers, :body)"
    ),
    send_without_recoverable=(
        'INSERT INTO {table} ("Id", "Expires", "Headers", "Body") '
        f"VALUES (:id, {_EXPIRES}, :headers, :body)"
    ),
    # SQLite serializes writers, so the oldest rows are never held by another receiver.
    # Headers come back as a BLOB and are decoded in Python: SQLite stores whatever bytes it is
    # given in a TEXT column, and the sqlite3 driver fails the whole fetch ("Could not decode to
    # UTF-8 column") on a value that is not UTF-8, which would block the queue behind that row.
    receive=(
        'DELETE FROM {table} WHERE "RowVersion" IN ('
        'SELECT "RowVersion" FROM {table} ORDER BY "RowVersion" LIMIT :n) '
        'RETURNING "Id", "RowVersion", '
        f'("Expires" IS NOT NULL AND "Expires" <= {_NOW}), '
        'CAST("Headers" AS BLOB), "Body"'
    ),
    # Two sub-selects: SQLite answers a lone MIN or MAX of the rowid from the b-tree's ends, but
    # scans the whole table for MAX(x) - MIN(x) in one select (a cost that grows with the queue).
    peek=(
        'SELECT COALESCE((SELECT MAX("RowVersion") FROM {table}) '
        '- (SELECT MIN("RowVersion") FROM {table}) + 1, 0)'
    ),
    purge_expired=(
        'DELETE FROM {table} WHERE "RowVersion" IN ('
        f'SELECT "RowVersion" FROM {{table}} WHERE "Expires" < {_NOW} '
        'ORDER BY "RowVersion" LIMIT :n)'
    ),
    purge_all="DELETE FROM {table}",
    # One writer at a time: nobody else holds the row.
    receive_by_id=(
        'DELETE FROM {table} WHERE "Id" = :id '
        'RETURNING "Id", "RowVersion", '
        f'("Expires" IS NOT NULL AND "Expires" <= {_NOW}), '
        'CAST("Headers" AS BLOB), "Body"'
    ),
    id_to_driver=lambda value: value.hex,
    # One write statement takes the write lock as it starts, as BEGIN IMMEDIATE would.
    autocommit="implicit",
)

#: A Spark stream's end offset: one writer at a time, so rows commit in RowVersion order and the
#: highest committed RowVersion is a fence.
STREAM_FENCE = base.StreamFence(kind=base.FenceKind.HIGHEST)

# Delayed delivery: Due is UTC text 'YYYY-MM-DD HH:MM:SS.SSS' (as Expires), which sorts as it
# compares. SQLite has no INSERT from a DELETE, so the move is two statements in the caller's
# transaction, which holds the only write lock: both pick the same rows, those due before one
# ``:now`` (this process's clock is the database's), in (Due, RowVersion) order.
_SQLITE_MATURED = (
    'SELECT "RowVersion" FROM {table} WHERE "Due" < :now '
    'ORDER BY "Due", "RowVersion" LIMIT :n'
)
DELAYED_STORE = (
    'INSERT INTO {table} ("Headers", "Body", "Due") VALUES (:headers, :body, '
    "strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (:due_ms / 1000.0) || ' seconds'))"
)
DELAYED_MOVE = (
    'INSERT INTO {queue} ("Id", "Recoverable", "Expires", "Headers", "Body") '
    'SELECT lower(hex(randomblob(16))), 1, NULL, "Headers", "Body" FROM {table} '
    f'WHERE "RowVersion" IN ({_SQLITE_MATURED}) ORDER BY "Due", "RowVersion"',
    f'DELETE FROM {{table}} WHERE "RowVersion" IN ({_SQLITE_MATURED})',
)
DELAYED_NEXT_DUE = (
    """SELECT (julianday("Due") - julianday('now')) * 86400.0 FROM {table} """
    'ORDER BY "Due" LIMIT 1'
)

#: Indexes of table ``:name``: their ``CREATE INDEX`` text holds the partial-index predicate.
INDEX_CATALOG = (
    "SELECT name, sql, 0, NULL FROM sqlite_master WHERE type = 'index' AND tbl_name = :name"
)


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
    hot_path=HOT_PATH,
    stream_fence=STREAM_FENCE,
    delayed_store=DELAYED_STORE,
    delayed_move=DELAYED_MOVE,
    delayed_next_due=DELAYED_NEXT_DUE,
    delayed_move_takes_now=True,
    name="sqlite",
    index_catalog=INDEX_CATALOG,
    alter_column="rebuild",
    identifier_limit=1024,
    begin=BEGIN,
    embedded=True,
    peek_counts_held_rows=True,
    single_writer=True,
    missing_table_markers=("no such table",),
    missing_column_markers=("no such column", "has no column named"),
    transient_markers=(*base.GENERIC_TRANSIENT, "database is locked"),
    flow=None,  # no locks shared between processes: flow control holds within one
)
