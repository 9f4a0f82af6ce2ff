"""The single-ingester lock: one reader (an ingest, a stream) per queue at a time.

PostgreSQL takes a session advisory lock, SQL Server a session applock (each dialect's
``DialectSupport.session_lock``); an embedded database (SQLite) takes an ``flock`` on a file
beside it, removed when the lock is released. The server or the kernel frees the lock if the
process dies. :func:`ingest_lock` picks the kind from what the engine's dialect supports
(``dialects.for_dialect(engine)``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import sqlalchemy as sa

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.contrib.spark import checks

log = logging.getLogger(__name__)

#: Seconds :func:`remove_lock_file` waits for a stopped stream's process to free the lock.
FILE_LOCK_WAIT_SECONDS = 10.0


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
    """An embedded database (SQLite): an ``flock`` on a file beside it; the kernel frees it.

    The file exists only while the lock is held: the holder removes it as it releases the lock
    (a killed holder leaves it, unlocked, for the next one to take and remove).
    """

    _fd: int | None = None

    @property
    def path(self) -> str:
        """``<database>.ingest-<digest>.lock``."""
        return f"{self.url.database}.ingest-{checks.digest(str(self.address))}.lock"

    def acquire(self) -> bool:
        """Lock the file without waiting (creating it if need be)."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            # A holder removes the file before it lets go: a lock got on a removed file locks
            # nothing another process could see, so open the path again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return True
            os.close(fd)

    def release(self) -> None:
        """Remove the file, then close the descriptor, which releases the flock."""
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            finally:
                os.close(self._fd)
                self._fd = None


class SessionLock(IngestLock):
    """A server lock owned by a connection (session) held for the whole ingestion.

    :param statements: the dialect's :class:`~sqlqueue_orm.dialects.statements.SessionLock`.
    """

    _connection: sa.Connection | None = None

    def __init__(
        self,
        engine: sa.Engine,
        url: sa.URL,
        address: addressing.QueueAddress,
        statements: dialects.statements.SessionLock,
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


def remove_lock_file(engine: sa.Engine, url: sa.URL, address: addressing.QueueAddress) -> None:
    """Take and give back a freed file lock, which removes its file (other kinds: nothing).

    Spark ends a stream's source process without asking it to release the lock: the kernel
    frees the ``flock``, the file stays. Waits at most :data:`FILE_LOCK_WAIT_SECONDS` for that
    process to end; leaves the file to a later ingestion if the lock is still taken then.
    """
    lock = ingest_lock(engine, url, address)
    if not isinstance(lock, FileLock) or not os.path.exists(lock.path):
        return
    deadline = time.monotonic() + FILE_LOCK_WAIT_SECONDS
    while not lock.acquire():
        if time.monotonic() > deadline:
            log.info("queue %s: %s is still locked; left for the next ingestion",
                     address, lock.path)
            return
        time.sleep(0.05)
    lock.release()


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
