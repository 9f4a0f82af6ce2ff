"""``ingest``: drain a queue into a Parquet dataset partitioned by ``date``, exactly once.

A thin use of the ``sqlqueue`` streaming source (:mod:`.streaming`), one code path for the
one-off run and for ``--follow``:

1. a lock makes it the only reader of that queue (PostgreSQL session advisory lock, SQL Server
   session applock, an ``flock`` beside a SQLite file), released by the server or the kernel
   if the process dies (:mod:`.locking`). The source holds it while the stream runs;
2. the source reads a micro-batch, a RowVersion range, in partitions over their own connections,
   without deleting;
3. ``foreachBatch`` writes it to ``_sqlqueue/staging/<batch>/`` (readers of the dataset ignore a
   leading ``_``), then writes ``_sqlqueue/committed/<batch>.json`` listing the files:
   **the commit point**; then the files are renamed into the dataset;
4. Spark records the batch in its checkpoint (``_sqlqueue/checkpoints/<queue>``), and only then
   does the source delete the batch's rows from the queue.

A batch Spark did not record is replayed with the same rows on the next run: if its manifest
exists, only its moves are finished (renames already done are skipped); otherwise its staging
directory is rewritten. So a crash at any point ends with each message exactly once in the
dataset. File operations use Hadoop's FileSystem of the path, so HDFS, S3A or ABFS paths work
as local ones (on object stores, a rename is a copy: readers may see a batch partly while it is
being moved, never twice). Each batch logs a progress line with the queue name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm.contrib.spark import checks, dataset, locking, streaming
from sqlqueue_orm.contrib.spark.locking import IngestError as IngestError
from sqlqueue_orm.contrib.spark.locking import IngestInProgress as IngestInProgress
from sqlqueue_orm.models.queue_table import queue_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Default rows per ingested batch (one Parquet commit, one delete transaction).
INGEST_BATCH_SIZE = 10_000
#: Largest batch :func:`ingest` takes (the driver holds one batch's keys, ~60 bytes a row).
MAX_INGEST_BATCH_SIZE = checks.MAX_INGEST_BATCH_SIZE



def _no_step(step: str, batch: int) -> None:
    """Nothing: the default :data:`on_step`."""


#: Called as a batch of this process's ingest reaches each step of its way into the dataset,
#: with the step and the batch's number in the run: ``written`` (to staging), ``committed``
#: (its manifest written), ``moved`` (its files in the dataset), and ``deleted`` (its rows about
#: to leave the queue, with the number of batches committed). Does nothing unless replaced: the
#: crash tests replace it, in the process running the ingest, to die at one of those steps.
on_step: Callable[[str, int], None] = _no_step

_STATE_DIR = "_sqlqueue"


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

    *messages* were written in *batches*; *recovered* batches of an interrupted run were
    finished first, with *recovered_messages* in them.
    """

    queue: str
    path: str
    messages: int
    batches: int
    recovered: int
    recovered_messages: int


@dataclasses.dataclass(eq=False)
class _BatchCommitter:
    """``foreachBatch`` of the ingest stream: each micro-batch into the dataset exactly once.

    Spark replays a micro-batch whose commit it did not record, with the same rows (the source
    deletes them only after the commit). The batch's manifest (``_sqlqueue/committed/<name>.json``)
    is the commit point: a replay of a batch with a manifest only finishes its moves.
    """

    spark: SparkSession
    files: _Files
    address: addressing.QueueAddress
    checkpoint: Any

    def __post_init__(self) -> None:
        self.slug = _slug(self.address)
        self.query_id: str | None = None
        self.messages = self.batches = self.recovered = self.recovered_messages = 0
        self.started = time.monotonic()

    def _prefix(self) -> str:
        if self.query_id is None:
            # Written by Spark when the query was first started; the same on every restart.
            metadata = self.files.read_text(self.files.child(self.checkpoint, "metadata"))
            self.query_id = str(json.loads(metadata.splitlines()[0])["id"])
        return f"{self.slug}-{self.query_id[:8]}-"

    def _clean(self, current: str) -> None:
        """Forget this queue's batches other than *current*.

        Spark committed the earlier ones (their moves were done), and staging without a
        manifest never reached the dataset.
        """
        for directory in ("committed", "staging"):
            parent = self.files.path(f"{_STATE_DIR}/{directory}")
            for name in self.files.names(parent):
                mine = name.startswith((self.slug + "-", "." + self.slug + "-"))
                if mine and not name.startswith((current, "." + current)):
                    self.files.delete(self.files.child(parent, name))

    def forget_through(self, batch_id: int) -> None:
        """Forget this query's batches up to *batch_id*, which Spark has committed."""
        if self.query_id is None:
            return
        prefix = self._prefix()
        for directory in ("committed", "staging"):
            parent = self.files.path(f"{_STATE_DIR}/{directory}")
            for name in self.files.names(parent):
                match = re.fullmatch(re.escape(prefix) + r"(\d{12})(\.json)?", name)
                if match and int(match.group(1)) <= batch_id:
                    self.files.delete(self.files.child(parent, name))

    def __call__(self, frame: Any, batch_id: int) -> None:
        """Write micro-batch *batch_id* to staging, commit it, move it into the dataset."""
        name = f"{self._prefix()}{batch_id:012d}"
        self._clean(name)
        manifest_path = self.files.path(f"{_STATE_DIR}/committed/{name}.json")
        staging = self.files.path(f"{_STATE_DIR}/staging/{name}")
        number = self.batches + 1
        if self.files.fs.exists(manifest_path):
            manifest = json.loads(self.files.read_text(manifest_path))
            log.warning("queue %s: finishing batch %s, committed by an interrupted run",
                        self.address, name)
            self._move(staging, manifest)
            self.recovered += 1
            self.recovered_messages += int(manifest["count"])
            return
        self.files.delete(staging)
        frame.write.mode("overwrite").partitionBy("date").parquet(self.files.uri(staging))
        on_step("written", number)
        count = (
            self.spark.read.schema(dataset.DATASET_SCHEMA).parquet(self.files.uri(staging)).count()
            if self.files.fs.exists(staging) else 0
        )
        manifest = {
            "format": 2,
            "queue": str(self.address),
            "batch": name,
            "files": self.files.data_files(staging),
            "count": count,
        }
        self.files.write_text(manifest_path, json.dumps(manifest))
        on_step("committed", number)
        self._move(staging, manifest)
        on_step("moved", number)
        self.batches += 1
        self.messages += count
        elapsed = max(time.monotonic() - self.started, 1e-6)
        log.info("queue %s: %d message(s) in %d batch(es) so far (%.0f msg/s)",
                 self.address, self.messages, self.batches, self.messages / elapsed)

    def _move(self, staging: Any, manifest: Mapping[str, Any]) -> None:
        for relative in manifest["files"]:
            self.files.move(self.files.child(staging, relative), self.files.path(relative))


def _last_committed(query: Any) -> tuple[int, int] | None:
    """(batch id, end offset) of the last batch the query committed.

    Read from its progress: Spark reports a batch's progress after its commit.
    """
    last: tuple[int, int] | None = None
    for progress in query.recentProgress:
        for source in progress.sources:
            if source.endOffset:  # a replayed batch may report no input rows
                end = source.endOffset
                end = json.loads(end) if isinstance(end, str) else end
                last = max(last or (-1, -1), (int(progress.batchId), int(end["row_version"])))
    return last


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
    follow: bool = False,
    stop: threading.Event | None = None,
    trigger_seconds: float = 1.0,
) -> IngestResult:
    """Drain *queue* into the Parquet dataset at *path*, exactly once.

    A stream of the ``sqlqueue`` source (:mod:`.streaming`) into the dataset, checkpointed
    under ``<path>/_sqlqueue/checkpoints/``.

    Stops when a batch comes back short (the queue was empty as of that read), when there is
    no data, or after *max_batches*; with *follow*, runs until *stop* is set. Safe to re-run
    after a crash at any point; at most one ingestion per queue runs at a time (another raises
    :class:`IngestInProgress`). Several queues (audit and error) may share one *path*.

    :param spark: the session (classic, not Spark Connect).
    :param url: the database URL; Spark tasks connect with it.
    :param queue: the queue address (``audit``, ``error@[nsb]``); not in another catalog.
    :param path: the dataset directory (any Hadoop path: ``/data/x``, ``hdfs://..``, ``s3a://..``).
    :param batch_size: messages per micro-batch at most.
    :param partitions: Spark tasks (connections) reading a batch (default: default parallelism).
    :param max_batches: stop after this many new batches.
    :param include_body: store the message bodies.
    :param follow: keep running (a trigger every *trigger_seconds*) until *stop* is set.
    :param stop: set it to end a *follow* run (after the current batch).
    :param trigger_seconds: the trigger interval of a *follow* run.
    """
    parsed_url, address = checks.check_ingest_arguments(
        url, queue, batch_size, partitions, max_batches
    )
    table = queue_table(address.table, address.schema, parsed_url.get_backend_name())
    files = _Files(spark, path)
    slices = partitions or spark.sparkContext.defaultParallelism
    engine = db.create_engine(url)
    try:
        checks.require_queue(engine, address)
        with locking.ingest_lock(engine, parsed_url, address):
            pass  # fail fast here; the source holds the lock while the stream runs
        streaming.register(spark)
        checkpoint = files.path(f"{_STATE_DIR}/checkpoints/{_slug(address)}")
        committer = _BatchCommitter(spark, files, address, checkpoint)
        reader = (
            spark.readStream.format(streaming.FORMAT)
            .option("url", url).option("queue", str(address))
            .option("partitions", str(slices)).option("maxRowsPerBatch", str(batch_size))
            .option("includeBody", str(include_body).lower())
            .load()
        )
        writer = reader.writeStream.foreachBatch(committer).option(
            "checkpointLocation", files.uri(checkpoint)
        )
        if follow:
            writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
        query = writer.start()
        try:
            _watch(query, address, batch_size, max_batches, follow, stop)
        finally:
            query.stop()
            locking.remove_lock_file(engine, parsed_url, address)
        last = _last_committed(query)
        if last is not None:
            on_step("deleted", committer.batches)
            streaming.delete_through(engine, table, str(address), last[1])
            committer.forget_through(last[0])
        error = query.exception()
        if error is not None:
            raise IngestError(f"queue {str(address)!r}: the ingest stream failed: "
                              f"{str(error).splitlines()[0]}")
    finally:
        engine.dispose()
    log.info("queue %s: ingested %d message(s) in %d batch(es) into %s",
             address, committer.messages, committer.batches, files.uri(files.root))
    return IngestResult(
        str(address), files.uri(files.root), committer.messages, committer.batches,
        committer.recovered, committer.recovered_messages,
    )


def _watch(
    query: Any,
    address: addressing.QueueAddress,
    batch_size: int,
    max_batches: int | None,
    follow: bool,
    stop: threading.Event | None,
) -> None:
    """Wait until the ingest is done (or *stop* is set), logging Spark's progress."""
    seen = -1
    batches = 0
    while query.isActive:
        if stop is not None and stop.is_set():
            return
        for progress in query.recentProgress:
            if progress.batchId <= seen or not progress.numInputRows:
                continue
            seen = progress.batchId
            batches += 1
            if follow:
                log.info("queue %s: batch %d: %d message(s), %.0f msg/s in, %.0f msg/s "
                         "processed", address, progress.batchId, progress.numInputRows,
                         progress.inputRowsPerSecond or 0.0,
                         progress.processedRowsPerSecond or 0.0)
            elif progress.numInputRows < batch_size:
                return
            if max_batches is not None and batches >= max_batches:
                return
        status = query.status
        if (not follow and not status["isTriggerActive"] and not status["isDataAvailable"]
                and str(status["message"]).startswith("Waiting for data")):
            return
        query.awaitTermination(0.1)
