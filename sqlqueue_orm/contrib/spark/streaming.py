"""The ``sqlqueue`` Spark data source: queues as streaming (and batch) sources and sinks.

Built on PySpark 4's Python data source API (no JVM code, no jar). :func:`register` makes the
format known to a session::

    register(spark)
    audit = (spark.readStream.format("sqlqueue").option("url", url).option("queue", "audit")
             .load())                                   # one row per message, DATASET_SCHEMA
    audit.writeStream.format("parquet").option("checkpointLocation", ...).start(path)

    rows.writeStream.format("sqlqueue").option("url", url).option("queue", "billing")
        .option("keyColumn", "order_id").option("checkpointLocation", ...).start()

**Source.** Offsets are ``{"row_version": N}``: a micro-batch is the rows whose RowVersion
(``seq`` on PostgreSQL) is in ``(start, end]``, read in several partitions (ranges of that
column), each over its own connection, and deleted from the queue only when Spark has committed
the batch (``commit(end)``, and again at the next ``latestOffset(start)``, which Spark calls only
after the batch ending at *start* is in its commit log). A query restarted from its checkpoint
re-reads an uncommitted batch, rows still there, and never a committed one.

The end offset is a *fence*: a value below which no transaction can still insert, because
identity values are taken at insert time and commit out of order (:mod:`.fences`: one way per
kind of dialect, chosen by what the dialect supports).

One stream per queue: the source takes the ingest lock of the queue (see
:mod:`.locking`) for as long as the query runs. ``spark.read.format("sqlqueue")`` is a
snapshot of the queue that deletes nothing.

**Sink.** One message per row, as :func:`~.sending.send_dataframe` sends them: options
``bodyColumn``, ``keyColumn``, ``headers`` (a JSON object) and ``headerColumns`` (a JSON object,
header -> column). Every message id is recorded in the send ledger in the transaction that
sends it, so a retried task or batch skips what was sent: with ``keyColumn`` exactly once per
key; without, a stream keys each row by (query id, batch id, partition, position), which a
replayed batch reproduces, and a batch write (``df.write``) sends at least once.

The options of both are read and checked in :mod:`~sqlqueue_orm.contrib.spark.options`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm import transport as transport_module
from sqlqueue_orm.contrib.spark import checks, dataset, fences, locking, sending, session
from sqlqueue_orm.contrib.spark.options import SinkOptions, SourceOptions
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_table

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession
    from pyspark.sql.streaming.datasource import ReadLimit
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: The format name: ``spark.readStream.format(FORMAT)``.
FORMAT = "sqlqueue"
#: Rows fetched per query while a partition is read (keyset pages keep transactions short).
PAGE_SIZE = 2_000
#: Seconds the source waits for the queue's ingest lock (a killed predecessor's may linger), and
#: for the fence to reach the last row of a ``trigger(availableNow=True)`` query.
LOCK_WAIT_SECONDS = 30.0


def register(spark: SparkSession) -> None:
    """Register the ``sqlqueue`` format with *spark* (once per session is enough)."""
    spark.dataSource.register(QueueDataSource)


class RowRange(InputPartition):
    """One partition of a read: the rows whose order column is in ``(low, high]``."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__((low, high))
        self.low = low
        self.high = high


def split_range(low: int, high: int, partitions: int) -> list[RowRange]:
    """``(low, high]`` in at most *partitions* contiguous ranges of about equal width."""
    width = high - low
    count = max(0, min(partitions, width))
    bounds = [low + width * i // count for i in range(count)] + [high] if count else []
    return [RowRange(bounds[i], bounds[i + 1]) for i in range(count)]


def read_range(options: SourceOptions, low: int, high: int) -> Iterator[tuple[object, ...]]:
    """Executor side: the dataset rows of ``(low, high]``, over a connection of this task."""
    engine = session.task_engine(options.url)
    table = queue_table(options.table, options.schema, engine)
    order = table.c.RowVersion
    statement = sa.select(table.c.Id, order, table.c.Headers, table.c.Body).order_by(order)
    ingested_at = dt.datetime.now(dt.UTC)
    cursor = low
    try:
        while cursor < high:
            with db.wrap_db_errors(options.queue), engine.connect() as connection:
                rows = connection.execute(
                    statement.where(order > cursor, order <= high).limit(PAGE_SIZE)
                ).all()
            for native_id, row_version, raw_headers, body in rows:
                yield dataset.parse_row(
                    options.queue,
                    str(native_id),
                    int(row_version),
                    raw_headers,
                    bytes(body) if body is not None and options.include_body else None,
                    ingested_at,
                )
            if len(rows) < PAGE_SIZE:
                break
            cursor = int(rows[-1][1])
    finally:
        engine.dispose()


# -- the source ----------------------------------------------------------------------------------
class QueueBatchReader(DataSourceReader):
    """``spark.read.format("sqlqueue")``: the queue's committed rows now; nothing is deleted."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[RowRange]:
        """Ranges of the order column between the lowest and highest row now."""
        engine = db.create_engine(self.options.url, poolclass=sa.pool.NullPool)
        try:
            table = queue_table(self.options.table, self.options.schema, engine)
            checks.require_queue(engine, addressing.QueueAddress.coerce(self.options.queue))
            order = table.c.RowVersion
            with db.wrap_db_errors(self.options.queue), engine.connect() as connection:
                low, high = connection.execute(
                    sa.select(sa.func.min(order), sa.func.max(order))
                ).one()
        finally:
            engine.dispose()
        if low is None:
            return []
        return split_range(int(low) - 1, int(high), self.options.partitions)

    def read(self, partition: InputPartition) -> Iterator[tuple[object, ...]]:
        """The rows of one range."""
        assert isinstance(partition, RowRange)
        return read_range(self.options, partition.low, partition.high)


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("sqlqueue")``: RowVersion ranges, deleted once committed."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._engine: sa.Engine | None = None
        self._lock: locking.IngestLock | None = None
        self._fence: fences.OffsetFence | None = None
        self._deleted_through = 0  # RowVersion and seq start at 1
        self._target: int | None = None  # the last row of a trigger(availableNow=True) query

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options; the engine, lock and fence stay on the driver.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def _start(self) -> tuple[sa.Engine, fences.OffsetFence]:
        if self._engine is None or self._fence is None:
            engine = db.create_engine(self.options.url)
            address = addressing.QueueAddress.coerce(self.options.queue)
            checks.require_queue(engine, address)
            lock = locking.ingest_lock(engine, sa.make_url(self.options.url), address)
            deadline = time.monotonic() + LOCK_WAIT_SECONDS
            while not lock.acquire():
                if time.monotonic() > deadline:
                    engine.dispose()
                    raise locking.IngestInProgress(
                        f"queue {self.options.queue!r}: another stream or ingestion of this queue "
                        f"is running (lock {lock.resource!r}); stop it first"
                    )
                time.sleep(0.5)
            table = queue_table(self.options.table, self.options.schema, engine)
            self._engine, self._lock = engine, lock
            self._fence = fences.fence_for(engine, table)
            log.info("queue %s: streaming from it (one stream per queue)", self.options.queue)
        return self._engine, self._fence

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: batches up to the highest row committed now.

        Spark then asks once more for a batch, which deletes the last one's rows, and ends.
        Transactions in flight may hold the fence below that row for a moment (PostgreSQL): it
        is waited for, or a first batch found empty would end the query at once.
        """
        engine, fence = self._start()
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        with db.wrap_db_errors(self.options.queue), engine.connect() as connection:
            top = connection.execute(sa.select(sa.func.max(fence.table.c.RowVersion))).scalar()
            target = 0 if top is None else int(top)
            while fence.bound(connection, 0) < target and time.monotonic() < deadline:
                time.sleep(0.1)
        self._target = target

    def initialOffset(self) -> dict[str, int]:
        """A new query starts before every row."""
        return {"row_version": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerBatch`` when given, else everything available."""
        if self.options.max_rows is not None:
            return ReadMaxRows(self.options.max_rows)
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The fence, or the *limit*-th row after *start* if that is lower.

        Spark calls this only once the batch ending at *start* is committed, so the rows up to
        *start* are deleted first (a commit that a crash or a stop prevented).
        """
        begin = int(start["row_version"])
        try:
            return {"row_version": self._latest(begin, limit)}
        except exceptions.DatabaseError as error:
            if not error.transient:
                raise
            # A lock timeout or a lost connection: no new batch this time; Spark asks again.
            log.warning("queue %s: no new batch this time: %s", self.options.queue, error)
            return {"row_version": begin}

    def _latest(self, begin: int, limit: ReadLimit) -> int:
        engine, fence = self._start()
        self.delete_through(begin)
        order = fence.table.c.RowVersion
        with db.wrap_db_errors(self.options.queue), engine.connect() as connection:
            end = fence.bound(connection, begin)
            if self._target is not None:
                end = max(begin, min(end, self._target))
            if end > begin and isinstance(limit, ReadMaxRows):
                window = (
                    sa.select(order).where(order > begin, order <= end)
                    .order_by(order).limit(limit.max_rows).subquery()
                )
                top = connection.execute(sa.select(sa.func.max(window.c[0]))).scalar()
                end = begin if top is None else int(top)
        return end

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[RowRange]:
        """``(start, end]`` in ranges of the order column, one Spark task (connection) each."""
        return split_range(
            int(start["row_version"]), int(end["row_version"]), self.options.partitions
        )

    def read(self, partition: InputPartition) -> Iterator[tuple[object, ...]]:
        """The rows of one range."""
        assert isinstance(partition, RowRange)
        return read_range(self.options, partition.low, partition.high)

    def commit(self, end: dict[str, int]) -> None:
        """Spark committed every batch up to *end*: delete those rows from the queue."""
        self.delete_through(int(end["row_version"]))

    def delete_through(self, end: int) -> None:
        """Delete the rows up to *end* (committed by Spark); idempotent."""
        if end <= self._deleted_through:
            return
        engine, fence = self._start()
        deleted = delete_through(engine, fence.table, self.options.queue, end)
        self._deleted_through = end
        if deleted:
            log.info("queue %s: deleted %d message(s) up to %d, committed by Spark",
                     self.options.queue, deleted, end)

    def stop(self) -> None:
        """Release the queue's lock and connections."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


def delete_through_statement(table: sa.Table) -> sa.Delete:
    """DELETE the rows up to the bound ``end`` (Spark committed them)."""
    return table.delete().where(table.c.RowVersion <= sa.bindparam("end"))


def delete_through(engine: sa.Engine, table: sa.Table, queue: str, end: int) -> int:
    """Delete *table*'s rows whose order value is at most *end*; how many went."""
    with db.wrap_db_errors(queue), engine.begin() as connection:
        result = connection.execute(delete_through_statement(table), {"end": end})
    return int(result.rowcount or 0)


# -- the sink ------------------------------------------------------------------------------------
@dataclasses.dataclass
class SentMessage(WriterCommitMessage):
    """What one write task did: messages *sent*, rows *skipped* (already in the ledger)."""

    sent: int
    skipped: int


def _body(options: SinkOptions, row: Row) -> bytes | str | None:
    if options.body_column is None:
        return json.dumps(row.asDict(recursive=True), default=str, separators=(",", ":"))
    value = row[options.body_column]
    if value is None or isinstance(value, bytes | str):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=True)
    return json.dumps(value, default=str, separators=(",", ":"))


def write_rows(options: SinkOptions, rows: Iterator[Row], row_key: Any) -> SentMessage:
    """Executor side: send one message per row in ledgered batches over this task's connection.

    :param row_key: ``(position, row) -> key or None``: the ledger key of each row.
    """
    plan = sending.SendPlan(
        url=options.url,
        destination=options.destination,
        default_schema=None,
        key_column="key",
        constant_headers=options.headers,
        header_names=tuple(name for name, _ in options.header_columns),
        batch_size=options.batch_size,
    )
    engine = session.task_engine(options.url)
    transport = transport_module.Transport(engine, verify_schema=False)
    sent = skipped = 0
    try:
        position = 0
        for batch in session.chunks(rows, options.batch_size):
            messages: list[OutgoingMessage] = []
            for row in batch:
                key = row_key(position, row)
                position += 1
                values = [
                    None if row[column] is None else str(row[column])
                    for _, column in options.header_columns
                ]
                fields = (_body(options, row), key, *values)
                messages.append(sending.to_message(plan, cast("Row", fields)))
            done, already = sending.send_batch(engine, transport, plan, messages)
            sent += done
            skipped += already
    finally:
        engine.dispose()
    return SentMessage(sent, skipped)


def _key_of(options: SinkOptions) -> Any:
    """The key of a row by its ``keyColumn``; ``None`` when the sink has no key column."""
    column = options.key_column
    if column is None:
        return None

    def key(position: int, row: Row) -> str | None:
        return None if row[column] is None else str(row[column])

    return key


def _fresh_id(position: int, row: Row) -> str:
    """A new id for each row (a batch write without a key column)."""
    return str(uuid.uuid4())


def _task_key() -> Any:
    """The key of a row by (query, batch, partition, position) of the running Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - Spark always runs writers in a task
        raise exceptions.ConfigurationError("the sqlqueue sink runs only in a Spark task")
    query = context.getLocalProperty("sql.streaming.queryId")
    batch = context.getLocalProperty("streaming.sql.batchId")
    prefix = f"{query}/{batch}/{context.partitionId()}/"
    return lambda position, row: f"{prefix}{position}"


class QueueBatchWriter(DataSourceWriter):
    """``df.write.format("sqlqueue")``: one message per row (exactly once per ``keyColumn``)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SentMessage:
        """Send this task's rows; without a key column each row gets a fresh id."""
        return write_rows(self.options, iterator, _key_of(self.options) or _fresh_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what was sent."""
        _log_sent(self.options, messages, None)


class QueueStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("sqlqueue")``: exactly once per key across retried batches."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SentMessage:
        """Send this task's rows, keyed by ``keyColumn`` or by (query, batch, partition, row)."""
        return write_rows(self.options, iterator, _key_of(self.options) or _task_key())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the batch sent."""
        _log_sent(self.options, messages, batchId)


def _log_sent(
    options: SinkOptions, messages: list[WriterCommitMessage | None], batch: int | None
) -> None:
    sent = sum(message.sent for message in messages if isinstance(message, SentMessage))
    skipped = sum(message.skipped for message in messages if isinstance(message, SentMessage))
    where = "" if batch is None else f" in batch {batch}"
    log.info("queue %s: sent %d message(s)%s, skipped %d already sent",
             options.destination, sent, where, skipped)


class QueueDataSource(DataSource):
    """The ``sqlqueue`` format: a queue as a source (:data:`DATASET_SCHEMA`) and as a sink."""

    @classmethod
    def name(cls) -> str:
        """``sqlqueue``."""
        return FORMAT

    def schema(self) -> StructType:
        """One row per message: the dataset's typed columns."""
        return dataset.DATASET_SCHEMA

    def reader(self, schema: StructType) -> QueueBatchReader:
        """A snapshot of the queue; nothing is deleted."""
        return QueueBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> QueueStreamReader:
        """A stream of the queue's messages, deleted as Spark commits them."""
        return QueueStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> QueueBatchWriter:
        """One message per row of a batch write."""
        return QueueBatchWriter(prepare_sink(SinkOptions.parse(self.options, schema)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> QueueStreamWriter:
        """One message per row of each micro-batch, exactly once per key."""
        return QueueStreamWriter(prepare_sink(SinkOptions.parse(self.options, schema)))


def prepare_sink(options: SinkOptions) -> SinkOptions:
    """Driver side, once: the destination must exist; the send ledger is created if missing.

    :raises QueueNotFound: if the destination does not exist.
    """
    engine = db.create_engine(options.url, poolclass=sa.pool.NullPool)
    try:
        checks.require_queue(engine, addressing.QueueAddress.coerce(options.destination))
        with db.wrap_db_errors(options.destination), engine.begin() as connection:
            sending.ledger_table().create(connection, checkfirst=True)
    finally:
        engine.dispose()
    return options
