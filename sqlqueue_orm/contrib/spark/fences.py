"""Offset fences of the ``sqlqueue`` stream source: the end offset of its next micro-batch.

The end offset is a *fence*: a value below which no transaction can still insert, because
identity values are taken at insert time and commit out of order. How a dialect finds one is
its ``DialectSupport.stream_fence`` (a :class:`~sqlqueue_orm.dialects.FenceKind` and the
statements it needs); one small class per kind:

* :attr:`~sqlqueue_orm.dialects.FenceKind.HIGHEST` (SQLite, which serialises writers): the
  highest committed RowVersion is a fence;
* :attr:`~sqlqueue_orm.dialects.FenceKind.SNAPSHOT` (PostgreSQL): the highest ``seq`` seen
  becomes the fence once every transaction that was in progress when it was seen (the ``xip``
  of a ``pg_current_snapshot()`` taken after it) has ended (``pg_xact_status``); until then the
  previous fence holds, so a writer holding its transaction open delays the stream, never skips
  a row;
* :attr:`~sqlqueue_orm.dialects.FenceKind.LOCKING_SCAN` (SQL Server): a range scan with
  ``READCOMMITTEDLOCK`` and without ``READPAST`` waits for rows still being inserted above the
  start.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sqlqueue_orm import dialects, exceptions


class OffsetFence:
    """The highest order value at or below which every row that will ever commit has committed.

    The base class reads the highest committed value (:attr:`FenceKind.HIGHEST`).

    :param table: the queue table.
    :param statements: the dialect's :class:`~sqlqueue_orm.dialects.statements.StreamFence`.
    """

    def __init__(self, table: sa.Table, statements: dialects.statements.StreamFence) -> None:
        self.table = table
        self.statements = statements

    def highest(self, connection: sa.Connection, start: int) -> int | None:
        """The highest committed order value (``None``: no rows), as the dialect reads it."""
        order = self.table.c.RowVersion
        return connection.execute(sa.select(sa.func.max(order))).scalar()

    def bound(self, connection: sa.Connection, start: int) -> int:
        """The fence now (at least *start*)."""
        top = self.highest(connection, start)
        return start if top is None else max(start, int(top))


class LockingScanFence(OffsetFence):
    """Scan ``(start, ...)`` with shared locks, waiting for rows being inserted."""

    def highest(self, connection: sa.Connection, start: int) -> int | None:
        """COUNT_BIG and MAX over the range: the count makes it read (and lock) every key."""
        statement = range_scan_statement(self.table, start, self.statements.scan_hint or "")
        count, top = connection.execute(statement).one()
        return None if not count else int(top)


def range_scan_statement(table: sa.Table, start: int, hint: str) -> sa.Select[Any]:
    """The locking scan's count and highest RowVersion above *start*, under table *hint*."""
    order = table.c.RowVersion
    return (
        sa.select(sa.func.count_big(sa.literal_column("*")), sa.func.max(order))
        .where(order > start)
        .with_hint(table, hint)
    )


class SnapshotFence(OffsetFence):
    """A seen order value becomes the fence once the transactions then in flight end."""

    #: Candidates waiting for their transactions (more are merged into the newest).
    MAX_PENDING = 64

    def __init__(self, table: sa.Table, statements: dialects.statements.StreamFence) -> None:
        super().__init__(table, statements)
        self.snapshot = sa.text(statements.snapshot or "")
        self.in_progress = sa.text(statements.in_progress or "")
        self.pending: list[tuple[int, str]] = []
        self.safe = 0

    def bound(self, connection: sa.Connection, start: int) -> int:
        """The newest candidate whose snapshot's transactions have all ended.

        Each call adds a candidate: the highest seq, with a snapshot taken after it was read.
        """
        self.safe = max(self.safe, start)
        top = self.highest(connection, start)
        connection.commit()  # the snapshot below is taken after the max was read
        snapshot = str(connection.execute(self.snapshot).scalar())
        if top is not None and int(top) > self.safe:
            if self.pending and self.pending[-1][0] == int(top):
                pass  # the older snapshot of the same candidate resolves first
            elif len(self.pending) >= self.MAX_PENDING:
                self.pending[-1] = (int(top), snapshot)
            else:
                self.pending.append((int(top), snapshot))
        while self.pending:
            candidate, taken = self.pending[0]
            busy = connection.execute(self.in_progress, {"snapshot": taken}).scalar()
            if busy:
                break
            self.safe = max(self.safe, candidate)
            self.pending.pop(0)
        connection.commit()
        return self.safe


#: The fence class of each kind.
_BY_KIND: dict[dialects.FenceKind, type[OffsetFence]] = {
    dialects.FenceKind.HIGHEST: OffsetFence,
    dialects.FenceKind.LOCKING_SCAN: LockingScanFence,
    dialects.FenceKind.SNAPSHOT: SnapshotFence,
}


def fence_for(engine: sa.Engine, table: sa.Table) -> OffsetFence:
    """The fence over *table* for the engine's dialect."""
    statements = dialects.for_dialect(engine).stream_fence
    if statements is None:
        raise exceptions.ConfigurationError(
            f"database dialect {engine.dialect.name!r} is not supported; "
            "use sqlite, postgresql or mssql"
        )
    return _BY_KIND[statements.kind](table, statements)
