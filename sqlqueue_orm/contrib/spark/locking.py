"""The single-ingester lock: one reader (an ingest, a stream) per queue at a time.

PostgreSQL takes a session advisory lock, SQL Server a session applock (each dialect's
``DialectSupport.session_lock``); an embedded database (SQLite) takes an ``flock`` on a file
beside it. The server or the kernel frees the lock if the process dies. :func:`ingest_lock`
picks the kind from what the engine's dialect supports (``dialects.for_dialect(engine)``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import sqlalchemy as sa

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.contrib.spark import checks

log = logging.getLogger(__name__)


class IngestError(exceptions.SqlQueueError):
    """An ingestion could not go on; nothing was lost (re-run it to finish)."""


class IngestInProgress(IngestError):
    """Another ingestion of this queue is running."""


class IngestLock:
    """Exclusive right to ingest one queue; the server (or kernel) frees it if we die.

    Subclasses hold one way of locking; :func:`ingest_lock` picks the one an engine supports.
    """

    def __init__(self, engine: sa.Engine, url: sa.URL, address: addressing.QueueAddress) -> None:
        self.engine = engine
        self.url = url
        self.address = address
        # sp_getapplock takes at most 255 characters: the digest keeps a cut name unique.
        self.resource = f"sqlqueue_orm:spark-ingest:{checks.digest(str(address))}:{address}"[:255]

    def acquire(self) -> bool:
        """Take the lock without waiting; whether it was granted."""
        raise NotImplementedError

    def release(self) -> None:
        """Give the lock back."""
        raise NotImplementedError

    def __enter__(self) -> IngestLock:
        if not self.acquire():
            raise IngestInProgress(
                f"queue {str(self.address)!r}: another ingestion of this queue is running "
                f"(lock {self.resource!r}); wait for it to end"
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class FileLock(IngestLock):
    """An embedded database (SQLite): an ``flock`` on a file beside it; the kernel frees it."""

    _fd: int | None = None

    def acquire(self) -> bool:
        """Lock ``<database>.ingest-<digest>.lock`` without waiting."""
        import fcntl

        path = f"{self.url.database}.ingest-{checks.digest(str(self.address))}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Close the descriptor, which releases the flock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SessionLock(IngestLock):
    """A server lock owned by a connection (session) held for the whole ingestion.

    :param statements: the dialect's :class:`~sqlqueue_orm.dialects.base.SessionLock`.
    """

    _connection: sa.Connection | None = None

    def __init__(
        self,
        engine: sa.Engine,
        url: sa.URL,
        address: addressing.QueueAddress,
        statements: dialects.base.SessionLock,
    ) -> None:
        super().__init__(engine, url, address)
        self.statements = statements

    def granted(self, status: Any) -> bool:
        """Whether the scalar the acquire statement returned means the lock was granted."""
        return self.statements.granted(status)

    def acquire(self) -> bool:
        """Run the acquire statement on a connection of its own, kept while the lock is held."""
        connection = self.engine.connect()
        try:
            with db.wrap_db_errors(str(self.address)):
                status = connection.execute(
                    sa.text(self.statements.acquire), {"resource": self.resource}
                ).scalar()
                connection.commit()
        except BaseException:
            connection.close()
            raise
        if not self.granted(status):
            connection.close()
            return False
        self._connection = connection
        return True

    def release(self) -> None:
        """Run the release statement (the server frees the lock anyway when the session ends)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.execute(sa.text(self.statements.release), {"resource": self.resource})
            connection.commit()
        except sa.exc.DBAPIError as error:
            log.warning("queue %s: could not release the ingest lock: %s", self.address, error)
        finally:
            connection.close()


def _unsupported(name: str) -> exceptions.ConfigurationError:
    return exceptions.ConfigurationError(
        f"database dialect {name!r} is not supported; use sqlite, postgresql or mssql"
    )


def ingest_lock(
    engine: sa.Engine, url: sa.URL, address: addressing.QueueAddress
) -> IngestLock:
    """The ingest lock of *address* for the engine's dialect (not taken yet)."""
    support = dialects.for_dialect(engine)
    if support.session_lock is not None:
        return SessionLock(engine, url, address, support.session_lock)
    if support.embedded:
        return FileLock(engine, url, address)
    raise _unsupported(engine.dialect.name)


def lock_statement(dialect_name: str) -> sa.TextClause:
    """The statement taking the session-scoped ingest lock without waiting (server dialects).

    Its scalar tells whether it got it (PostgreSQL: a boolean; SQL Server: sp_getapplock's
    status, >= 0 when granted).
    """
    support = dialects.for_dialect(dialect_name)
    if support.session_lock is None:
        if support.embedded:
            raise exceptions.ConfigurationError(
                f"database dialect {dialect_name!r} locks a file, not with a statement"
            )
        raise _unsupported(dialect_name)
    return sa.text(support.session_lock.acquire)
