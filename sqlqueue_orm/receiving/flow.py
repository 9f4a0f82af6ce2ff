"""Flow control shared by every process on a queue (issue 17): the global concurrency limit.

``EndpointSettings(global_concurrency=K)``: at most K messages of the queue are handled at once,
counted across every process and every endpoint instance receiving from it with the same limit.
Its state lives in locks, never in a column of the queue table (which .NET endpoints share):

* **PostgreSQL**: K transaction-scoped advisory locks, ``(hashtext('sqlqueue.slots.' ||
  <queue address>), 0..K-1)``. The receive's transaction takes the first free one
  (``pg_try_advisory_xact_lock``, one statement) before it receives, and holds it until it
  commits or rolls back, so the slot covers the receive, the handlers and the commit; a crash
  frees it with the connection.
* **SQL Server**: the same with ``sp_getapplock`` (``@LockOwner = 'Transaction'``, no wait) on
  K resources named after a SHA-256 of the queue address.
* **SQLite**: one process only (the database has no shared locks to hold): a semaphore of K
  per database file and queue, shared by the endpoints of this process.

A worker that finds every slot taken keeps its transaction open without locks and tries again
every 5 to 20 ms for up to :data:`SLOT_WAIT` seconds, then gives up (the pump peeks again).
The limit needs a mode whose transaction spans the handling: NONE is refused on PostgreSQL and
SQL Server.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

from sqlqueue_orm import dialects, exceptions

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

#: Longest a worker waits for a free slot before it gives up this receive.
SLOT_WAIT = 0.5
#: Prefix of the lock names (PostgreSQL: hashed into the advisory lock's first key).
LOCK_PREFIX = "sqlqueue.slots."

#: Claim the first free slot of ``:k`` in the caller's transaction; the slot number, or no row
#: (PostgreSQL) or -1 (SQL Server) when all are held. LIMIT 1 stops the scan at the first lock
#: taken, so one slot at most is claimed.
CLAIM_SLOT: Final[dict[str, str]] = {
    "postgresql": (
        "SELECT slot FROM generate_series(0, CAST(:k AS integer) - 1) AS slot "
        "WHERE pg_try_advisory_xact_lock(hashtext(:name), slot) LIMIT 1"
    ),
    # EXEC takes variables, not expressions: the resource name is built in @resource first.
    "mssql": (
        "SET NOCOUNT ON; "
        "DECLARE @k int = :k, @slot int = 0, @result int, @resource nvarchar(255), "
        "@base nvarchar(64) = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
        "CAST(:name AS nvarchar(4000))), 2); "
        "WHILE @slot < @k BEGIN "
        "SET @resource = N'sqlqueue.slots.' + @base + N'.' + CAST(@slot AS nvarchar(10)); "
        "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Transaction', @LockTimeout = 0; "
        "IF @result >= 0 BREAK; "
        "SET @slot += 1; "
        "END; "
        "SELECT CASE WHEN @slot < @k THEN @slot ELSE -1 END;"
    ),
}

_local_lock = threading.Lock()
_local_semaphores: dict[tuple[str, str], tuple[int, threading.BoundedSemaphore]] = {}


def _semaphore(engine: Engine, name: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of *name* in *engine*'s database (SQLite)."""
    key = (engine.url.render_as_string(hide_password=True), name)
    with _local_lock:
        found = _local_semaphores.get(key)
        if found is None:
            found = _local_semaphores[key] = (limit, threading.BoundedSemaphore(limit))
        elif found[0] != limit:
            raise exceptions.ConfigurationError(
                f"queue {name}: global_concurrency {limit} differs from the {found[0]} another "
                "endpoint of this process set on the same queue"
            )
        return found[1]


class GlobalConcurrency:
    """At most *limit* messages of one queue in flight across processes (module docstring).

    :param engine: the queue's database.
    :param name: the queue's address as text (what the lock names are made of).
    :param limit: slots.
    """

    def __init__(self, engine: Engine, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.local = dialects.for_dialect(engine).single_writer
        self._semaphore = _semaphore(engine, name, limit) if self.local else None
        self._statement = None if self.local else sa.text(CLAIM_SLOT[engine.dialect.name])

    def enter(self) -> bool:
        """SQLite: take a slot of this process (wait up to :data:`SLOT_WAIT`); else True."""
        if self._semaphore is None:
            return True
        return self._semaphore.acquire(timeout=SLOT_WAIT)

    def leave(self) -> None:
        """SQLite: give the slot :meth:`enter` took back."""
        if self._semaphore is not None:
            self._semaphore.release()

    def claim(self, connection: Connection) -> bool:
        """Take a free slot for the life of *connection*'s transaction; False if none came."""
        if self._statement is None:
            return True
        deadline = time.monotonic() + SLOT_WAIT
        while True:
            slot = connection.execute(
                self._statement, {"k": self.limit, "name": LOCK_PREFIX + self.name}
            )
            number = slot.scalar()
            if number is not None and number >= 0:
                return True
            if time.monotonic() >= deadline:
                log.debug(
                    "queue %s: all %d global slots busy for %.1f s",
                    self.name,
                    self.limit,
                    SLOT_WAIT,
                )
                return False
            time.sleep(random.uniform(0.005, 0.02))  # noqa: S311  (jitter, not secrets)
