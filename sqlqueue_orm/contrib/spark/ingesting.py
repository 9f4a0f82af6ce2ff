"""``ingest``: drain a queue into a Parquet dataset partitioned by ``date``, exactly once.

1. a lock makes it the only ingester of that queue (PostgreSQL session advisory lock, SQL Server
   session applock, an ``flock`` beside a SQLite file), released by the server or the kernel
   if the process dies; each dialect's lock is one small class registered by ``__dialect__``;
2. the driver reads the RowVersion and Id of the oldest *batch_size* rows, without deleting;
3. Spark tasks fetch those rows by RowVersion (their own connections), parse the headers with
   built-in functions (:func:`~sqlqueue_orm.contrib.spark.dataset.parse_messages`) and write the
   batch to ``_sqlqueue/staging/<batch>/``, which readers of the dataset ignore (a leading ``_``);
4. the driver writes ``_sqlqueue/committed/<batch>.json`` listing the files and the
   (RowVersion, Id) of every row in them, read back from the files: **the commit point**;
5. the files are renamed into the dataset, then exactly those rows are deleted from the queue in
   one transaction, then the manifest and staging directory are removed.

A re-run first finishes every committed batch of that queue (renames are skipped when done,
deleting gone rows is a no-op) and discards staging directories without a manifest (their rows
are still in the queue), so a crash at any point ends with each message exactly once in the
dataset. File operations use Hadoop's FileSystem of the path, so HDFS, S3A or ABFS paths work
as local ones (on object stores, a rename is a copy: readers may see a batch partly while it is
being moved, never twice). Each batch logs a progress line with the queue name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.contrib.spark import checks, dataset, session
from sqlqueue_orm.models.queue_table import queue_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Default rows per ingested batch (one Parquet commit, one delete transaction).
INGEST_BATCH_SIZE = 10_000
#: Largest batch :func:`ingest` takes (the driver holds one batch's keys, ~60 bytes a row).
MAX_INGEST_BATCH_SIZE = checks.MAX_INGEST_BATCH_SIZE

#: Test seam: ``SQLQUEUE_SPARK_TEST_KILL_AT=<point>:<n>`` SIGKILLs the ingesting process when
#: batch *n* of the run reaches *point* (``written``, ``committed``, ``moved``, ``deleted``).
KILL_AT_ENV = "SQLQUEUE_SPARK_TEST_KILL_AT"

_STATE_DIR = "_sqlqueue"


class IngestError(exceptions.SqlQueueError):
    """An ingestion could not go on; nothing was lost (re-run it to finish)."""


class IngestInProgress(IngestError):
    """Another ingestion of this queue is running."""


# -- the single-ingester lock: one small class per dialect ------------------------------------
class IngestLock:
    """Exclusive right to ingest one queue; the server (or kernel) frees it if we die.

    Subclasses hold one dialect's way and register themselves by ``__dialect__`` (as Alembic's
    ``DefaultImpl`` does); :func:`ingest_lock` picks the one of an engine.
    """

    __dialect__: ClassVar[str] = ""
    _by_dialect: ClassVar[dict[str, type[IngestLock]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dialect__:
            IngestLock._by_dialect[cls.__dialect__] = cls

    def __init__(self, engine: sa.Engine, url: sa.URL, address: addressing.QueueAddress) -> None:
        self.engine = engine
        self.url = url
        self.address = address
        # sp_getapplock takes at most 255 characters: the digest keeps a cut name unique.
        self.resource = f"sqlqueue_orm:spark-ingest:{checks.digest(str(address))}:{address}"[:255]

    @classmethod
    def for_dialect(cls, name: str) -> type[IngestLock]:
        """The lock class of dialect *name*."""
        try:
            return cls._by_dialect[name]
        except KeyError:
            raise exceptions.ConfigurationError(
                f"database dialect {name!r} is not supported; use sqlite, postgresql or mssql"
            ) from None

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


class _FileLock(IngestLock):
    """SQLite: an ``flock`` on a file beside the database; the kernel frees it."""

    __dialect__ = "sqlite"
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


class _SessionLock(IngestLock):
    """A server lock owned by a connection (session) held for the whole ingestion."""

    ACQUIRE: ClassVar[str]
    RELEASE: ClassVar[str]
    _connection: sa.Connection | None = None

    def granted(self, status: Any) -> bool:
        """Whether the scalar of :attr:`ACQUIRE` means the lock was granted."""
        return status is True

    def acquire(self) -> bool:
        """Run :attr:`ACQUIRE` on a connection of its own, kept while the lock is held."""
        connection = self.engine.connect()
        try:
            with db.wrap_db_errors(str(self.address)):
                status = connection.execute(
                    sa.text(self.ACQUIRE), {"resource": self.resource}
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
        """Run :attr:`RELEASE` (the server frees the lock anyway when the connection drops)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.execute(sa.text(self.RELEASE), {"resource": self.resource})
            connection.commit()
        except sa.exc.DBAPIError as error:
            log.warning("queue %s: could not release the ingest lock: %s", self.address, error)
        finally:
            connection.close()


class _PostgresqlLock(_SessionLock):
    """PostgreSQL: a session advisory lock on a 64-bit hash of the resource name."""

    __dialect__ = "postgresql"
    ACQUIRE = dialects.postgresql.SUPPORT.session_lock_acquire or ""
    RELEASE = dialects.postgresql.SUPPORT.session_lock_release or ""


class _MssqlLock(_SessionLock):
    """SQL Server: ``sp_getapplock`` owned by the session, held across transactions."""

    __dialect__ = "mssql"
    ACQUIRE = dialects.mssql.SUPPORT.session_lock_acquire or ""
    RELEASE = dialects.mssql.SUPPORT.session_lock_release or ""

    def granted(self, status: Any) -> bool:
        """sp_getapplock's status is >= 0 when granted."""
        return status is not None and int(status) >= 0


def ingest_lock(
    engine: sa.Engine, url: sa.URL, address: addressing.QueueAddress
) -> IngestLock:
    """The ingest lock of *address* for the engine's dialect (not taken yet)."""
    return IngestLock.for_dialect(engine.dialect.name)(engine, url, address)


def lock_statement(dialect_name: str) -> sa.TextClause:
    """The statement taking the session-scoped ingest lock without waiting (server dialects).

    Its scalar tells whether it got it (PostgreSQL: a boolean; SQL Server: sp_getapplock's
    status, >= 0 when granted).
    """
    lock = IngestLock.for_dialect(dialect_name)
    if not issubclass(lock, _SessionLock):
        raise exceptions.ConfigurationError(
            f"database dialect {dialect_name!r} locks a file, not with a statement"
        )
    return sa.text(lock.ACQUIRE)


def _slug(address: addressing.QueueAddress) -> str:
    """A file-name-safe, unique prefix of this queue's batches."""
    readable = re.sub(r"[^A-Za-z0-9]+", "_", str(address)).strip("_")[:40] or "queue"
    return f"{readable}-{checks.digest(str(address))}"


# -- files (Hadoop FileSystem of the dataset path) -------------------------------------------
class _Files:
    """The dataset directory through Hadoop's FileSystem API (local, HDFS, S3A, ABFS ...)."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        context = spark.sparkContext
        jvm = getattr(context, "_jvm", None)
        if jvm is None:
            raise exceptions.ConfigurationError(
                "ingest needs a classic SparkSession (it moves files with Hadoop's FileSystem); "
                "Spark Connect sessions are not supported"
            )
        self._jvm = jvm
        path = jvm.org.apache.hadoop.fs.Path(root)
        self.fs = path.getFileSystem(context._jsc.hadoopConfiguration())
        self.root = self.fs.makeQualified(path)

    def path(self, relative: str) -> Any:
        """The path *relative* (``/``-separated) under the dataset root."""
        return self._jvm.org.apache.hadoop.fs.Path(self.root, relative)

    def child(self, parent: Any, relative: str) -> Any:
        """The path *relative* under *parent*."""
        return self._jvm.org.apache.hadoop.fs.Path(parent, relative)

    def uri(self, path: Any) -> str:
        """The path as Spark's readers and writers take it."""
        return str(path.toString())

    def names(self, directory: Any) -> list[str]:
        """Entry names in *directory* (empty if it does not exist)."""
        if not self.fs.exists(directory):
            return []
        return sorted(str(status.getPath().getName()) for status in self.fs.listStatus(directory))

    def data_files(self, directory: Any) -> list[str]:
        """Data files under *directory*, relative to it (Spark's markers and checksums left out)."""
        if not self.fs.exists(directory):
            return []
        base = str(self.fs.makeQualified(directory).toUri().getPath()).rstrip("/") + "/"
        found: list[str] = []
        iterator = self.fs.listFiles(directory, True)
        while iterator.hasNext():
            path = iterator.next().getPath()
            name = str(path.getName())
            if name.startswith(("_", ".")):
                continue
            full = str(path.toUri().getPath())
            if not full.startswith(base):
                raise IngestError(f"file {full!r} is not under {base!r}")
            found.append(full[len(base):])
        return sorted(found)

    def read_text(self, path: Any) -> str:
        """The UTF-8 content of *path*."""
        stream = self.fs.open(path)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode("utf-8")

    def write_text(self, path: Any, text: str) -> None:
        """Write *path* whole or not at all (a hidden temporary file, then a rename)."""
        temporary = self.child(path.getParent(), "." + str(path.getName()) + ".tmp")
        stream = self.fs.create(temporary, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        if self.fs.exists(path):
            self.fs.delete(path, False)
        if not self.fs.rename(temporary, path):
            raise IngestError(f"could not rename {self.uri(temporary)} to {self.uri(path)}")

    def move(self, source: Any, target: Any) -> bool:
        """Rename *source* to *target*; ``False`` if *source* is gone and *target* is there."""
        if not self.fs.exists(source):
            if self.fs.exists(target):
                return False
            raise IngestError(
                f"committed file {self.uri(source)} is missing and not at {self.uri(target)}"
            )
        self.fs.mkdirs(target.getParent())
        if not self.fs.rename(source, target):
            raise IngestError(f"could not rename {self.uri(source)} to {self.uri(target)}")
        return True

    def delete(self, path: Any) -> None:
        """Delete *path* (recursively) if it exists."""
        if self.fs.exists(path):
            self.fs.delete(path, True)


# -- the commit protocol -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class IngestResult:
    """What :func:`ingest` did.

    *messages* were written and deleted in *batches*; *recovered* batches of an interrupted run
    were finished first, with *recovered_messages* in them.
    """

    queue: str
    path: str
    messages: int
    batches: int
    recovered: int
    recovered_messages: int


def _kill_point(point: str, batch: int) -> None:
    """Test seam: die here, as a crash would (see :data:`KILL_AT_ENV`)."""
    if os.environ.get(KILL_AT_ENV) == f"{point}:{batch}":
        log.warning("killing the ingest at %s of batch %d (%s)", point, batch, KILL_AT_ENV)
        logging.shutdown()
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def _batch_keys(
    engine: sa.Engine, table: sa.Table, address: addressing.QueueAddress, batch_size: int
) -> list[tuple[int, str]]:
    """The (RowVersion, Id) of the oldest *batch_size* committed rows; nothing is deleted."""
    with db.wrap_db_errors(str(address)), engine.begin() as connection:
        rows = connection.execute(batch_keys_statement(table, batch_size)).all()
    return [(int(row_version), str(native_id)) for row_version, native_id in rows]


def batch_keys_statement(table: sa.Table, batch_size: int) -> sa.Select[Any]:
    """SELECT the oldest rows' keys; SQL Server skips rows still being inserted (READPAST)."""
    statement = (
        sa.select(table.c.RowVersion, table.c.Id).order_by(table.c.RowVersion).limit(batch_size)
    )
    for support in dialects.ALL.values():
        if support.committed_read_hint is not None:
            statement = statement.with_hint(table, support.committed_read_hint, support.name)
    return statement


def delete_statement(table: sa.Table) -> sa.Delete:
    """DELETE one ingested row by RowVersion *and* Id (executemany over a batch)."""
    return table.delete().where(
        table.c.RowVersion == sa.bindparam("row_version"), table.c.Id == sa.bindparam("native_id")
    )


def _fetch_partition(
    url: str, table_name: str, schema: str | None, claims: Iterator[Any]
) -> Iterator[tuple[str, int, str, bytes | None]]:
    """Executor side: read the claimed rows by RowVersion, in short transactions."""
    wanted = {int(row_version): str(native_id) for row_version, native_id in claims}
    if not wanted:
        return
    engine = session.task_engine(url)
    table = queue_table(table_name, schema, engine)
    statement = sa.select(table.c.Id, table.c.RowVersion, table.c.Headers, table.c.Body)
    try:
        for chunk in session.chunks(sorted(wanted), session.IN_CHUNK):
            with engine.connect() as connection:
                rows = connection.execute(statement.where(table.c.RowVersion.in_(chunk))).all()
            for native_id, row_version, raw_headers, body in sorted(rows, key=lambda r: int(r[1])):
                if wanted.get(int(row_version)) == str(native_id):
                    yield (
                        str(native_id),
                        int(row_version),
                        raw_headers,
                        None if body is None else bytes(body),
                    )
    finally:
        engine.dispose()


def _finish_batch(
    files: _Files,
    engine: sa.Engine,
    table: sa.Table,
    address: addressing.QueueAddress,
    manifest: Mapping[str, Any],
    number: int,
) -> None:
    """After the commit point: move the files in, delete the rows, forget the batch."""
    batch = str(manifest["batch"])
    staging = files.path(f"{_STATE_DIR}/staging/{batch}")
    for relative in manifest["files"]:
        files.move(files.child(staging, relative), files.path(relative))
    _kill_point("moved", number)
    rows = [
        {"row_version": int(row_version), "native_id": uuid.UUID(native_id)}
        for row_version, native_id in manifest["rows"]
    ]
    if rows:
        with db.wrap_db_errors(str(address)), engine.begin() as connection:
            connection.execute(delete_statement(table), rows)
    _kill_point("deleted", number)
    files.delete(staging)
    files.delete(files.path(f"{_STATE_DIR}/committed/{batch}.json"))
    log.info("queue %s: batch %s done: %d message(s) in the dataset and off the queue",
             address, batch, len(rows))


def _recover(
    files: _Files, engine: sa.Engine, table: sa.Table, address: addressing.QueueAddress
) -> tuple[int, int]:
    """Finish this queue's committed batches, discard its uncommitted ones."""
    slug = _slug(address)
    committed_dir = files.path(f"{_STATE_DIR}/committed")
    batches = messages = 0
    finished: set[str] = set()
    for name in files.names(committed_dir):
        if name.startswith("." + slug + "-") and name.endswith(".tmp"):  # being written
            files.delete(files.child(committed_dir, name))
            continue
        if not (name.startswith(slug + "-") and name.endswith(".json")):
            continue
        manifest = json.loads(files.read_text(files.child(committed_dir, name)))
        if manifest.get("queue") != str(address):
            continue
        log.warning("queue %s: finishing batch %s, committed by an interrupted run",
                    address, manifest["batch"])
        _finish_batch(files, engine, table, address, manifest, 0)
        finished.add(str(manifest["batch"]))
        batches += 1
        messages += len(manifest["rows"])
    staging_dir = files.path(f"{_STATE_DIR}/staging")
    for name in files.names(staging_dir):
        if name.startswith(slug + "-") and name not in finished:
            log.warning("queue %s: discarding uncommitted batch %s (its messages are still in "
                        "the queue)", address, name)
            files.delete(files.child(staging_dir, name))
    return batches, messages


def _ingest_batch(
    spark: SparkSession,
    files: _Files,
    url: str,
    address: addressing.QueueAddress,
    claims: list[tuple[int, str]],
    number: int,
    partitions: int,
    include_body: bool,
) -> dict[str, Any]:
    """Write one claimed batch to staging and commit it; return its manifest."""
    batch = f"{_slug(address)}-{claims[0][0]:020d}-{claims[-1][0]:020d}"
    staging = files.path(f"{_STATE_DIR}/staging/{batch}")
    ingested_at = dt.datetime.now(dt.UTC)
    slices = max(1, min(partitions, len(claims)))
    fetch = functools.partial(_fetch_partition, url, address.table, address.schema)
    rows = spark.sparkContext.parallelize(claims, slices).mapPartitions(fetch)
    raw = spark.createDataFrame(rows, dataset.QUEUE_ROW_SCHEMA)
    parsed = dataset.parse_messages(raw, str(address), ingested_at, include_body=include_body)
    parsed.write.mode("overwrite").partitionBy("date").parquet(files.uri(staging))
    _kill_point("written", number)
    # What the files hold, read back from them: exactly these rows will leave the queue.
    written = (
        spark.read.schema(dataset.DATASET_SCHEMA).parquet(files.uri(staging))
        .select("row_version", "native_id").collect()
    )
    if len(written) != len(claims):
        log.warning("queue %s: %d of %d claimed message(s) were gone when read (another "
                    "consumer?); they are not in the dataset", address,
                    len(claims) - len(written), len(claims))
    manifest = {
        "format": 1,
        "queue": str(address),
        "batch": batch,
        "ingested_at": ingested_at.isoformat(),
        "files": files.data_files(staging),
        "rows": sorted([int(row[0]), str(row[1])] for row in written),
    }
    files.write_text(files.path(f"{_STATE_DIR}/committed/{batch}.json"), json.dumps(manifest))
    _kill_point("committed", number)
    return manifest


def ingest(
    spark: SparkSession,
    url: str,
    queue: str | addressing.QueueAddress,
    path: str,
    *,
    batch_size: int = INGEST_BATCH_SIZE,
    partitions: int | None = None,
    max_batches: int | None = None,
    include_body: bool = True,
) -> IngestResult:
    """Drain *queue* into the Parquet dataset at *path*, exactly once (see the module docstring).

    Stops when a batch comes back short (the queue was empty as of that read) or after
    *max_batches*. Safe to re-run after a crash at any point; at most one ingestion per queue
    runs at a time (another raises :class:`IngestInProgress`). Several queues (audit and error)
    may share one *path*.

    :param spark: the session (classic, not Spark Connect).
    :param url: the database URL; Spark tasks connect with it.
    :param queue: the queue address (``audit``, ``error@[nsb]``); not in another catalog.
    :param path: the dataset directory (any Hadoop path: ``/data/x``, ``hdfs://..``, ``s3a://..``).
    :param batch_size: messages per batch: one Parquet commit and one delete transaction.
    :param partitions: Spark tasks reading and writing a batch (default: default parallelism).
    :param max_batches: stop after this many new batches.
    :param include_body: store the message bodies.
    """
    parsed_url, address = checks.check_ingest_arguments(
        url, queue, batch_size, partitions, max_batches
    )
    table = queue_table(address.table, address.schema, parsed_url.get_backend_name())
    files = _Files(spark, path)
    slices = partitions or spark.sparkContext.defaultParallelism
    engine = db.create_engine(url)
    messages = batches = 0
    started = time.monotonic()
    try:
        checks.require_queue(engine, address)
        with ingest_lock(engine, parsed_url, address):
            recovered, recovered_messages = _recover(files, engine, table, address)
            while max_batches is None or batches < max_batches:
                claims = _batch_keys(engine, table, address, batch_size)
                if not claims:
                    break
                batches += 1
                manifest = _ingest_batch(
                    spark, files, url, address, claims, batches, slices, include_body
                )
                _finish_batch(files, engine, table, address, manifest, batches)
                messages += len(manifest["rows"])
                elapsed = max(time.monotonic() - started, 1e-6)
                log.info("queue %s: %d message(s) in %d batch(es) so far (%.0f msg/s)",
                         address, messages, batches, messages / elapsed)
                if len(claims) < batch_size:
                    break
    finally:
        engine.dispose()
    log.info("queue %s: ingested %d message(s) in %d batch(es) into %s",
             address, messages, batches, files.uri(files.root))
    return IngestResult(
        str(address), files.uri(files.root), messages, batches, recovered, recovered_messages
    )
