"""Spark pipelines over queues: :func:`send_dataframe`, :func:`ingest` and :func:`report`.

Every database access runs in Python with the project's own drivers: each Spark task opens its
own connection from the URL string (sqlite3, psycopg or pyodbc, through
:func:`sqlqueue_orm.db.create_engine`), so no JDBC jar is needed and the same code runs on
``local[*]`` and on a cluster whose executors have ``sqlqueue_orm`` and the driver installed.

**send_dataframe** sends one message per row. Each partition sends in batches of *batch_size*
over its own connection, one transaction per batch. With a *key_column* the NServiceBus.MessageId
is ``uuid5(namespace, destination + key)`` and each batch records its message ids in
``SparkSendLedger`` in the same transaction as the sends, so a re-run (or a retried task) skips
every key already sent: exactly once per key while its ledger row exists. Without a key column a
re-run sends everything again (at least once).

**ingest** drains a queue into a Parquet dataset partitioned by ``date``, exactly once:

1. a lock makes it the only ingester of that queue (PostgreSQL session advisory lock, SQL Server
   session applock, an ``flock`` beside a SQLite file), released by the server or the kernel
   if the process dies;
2. the driver reads the RowVersion and Id of the oldest *batch_size* rows, without deleting;
3. Spark tasks fetch those rows by RowVersion (their own connections), parse the headers with
   built-in functions and write the batch to ``_sqlqueue/staging/<batch>/``, which readers of the
   dataset ignore (a leading ``_``);
4. the driver writes ``_sqlqueue/committed/<batch>.json`` listing the files and the
   (RowVersion, Id) of every row in them, read back from the files: **the commit point**;
5. the files are renamed into the dataset, then exactly those rows are deleted from the queue in
   one transaction, then the manifest and staging directory are removed.

A re-run first finishes every committed batch of that queue (renames are skipped when done,
deleting gone rows is a no-op) and discards staging directories without a manifest (their rows
are still in the queue), so a crash at any point ends with each message exactly once in the
dataset. File operations use Hadoop's FileSystem of the path, so HDFS, S3A or ABFS paths work
as local ones (on object stores, a rename is a copy: readers may see a batch partly while it is
being moved, never twice).

**report** aggregates a dataset with Spark SQL: :func:`summary`, :func:`throughput` and
:func:`failures` are pure DataFrame -> DataFrame functions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import logging
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm import headers as nsb_headers
from sqlqueue_orm import transport as transport_module
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.models import spark_ledger
from sqlqueue_orm.models.queue_table import queue_table

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

log = logging.getLogger(__name__)

# -- schemas -----------------------------------------------------------------------------------
#: A queue row as Spark sees it (mirrors Id, RowVersion, Headers, Body of the queue table).
QUEUE_ROW_SCHEMA = T.StructType(
    [
        T.StructField("native_id", T.StringType(), False),
        T.StructField("row_version", T.LongType(), False),
        T.StructField("raw_headers", T.StringType(), False),
        T.StructField("body", T.BinaryType(), True),
    ]
)

#: The ingested dataset: typed header columns, the raw headers and body, partitioned by ``date``
#: (the UTC date of ``event_time``). Durations are in milliseconds.
DATASET_SCHEMA = T.StructType(
    [
        T.StructField("queue", T.StringType(), False),
        T.StructField("native_id", T.StringType(), False),
        T.StructField("row_version", T.LongType(), False),
        T.StructField("message_id", T.StringType(), False),
        T.StructField("message_type", T.StringType(), True),
        T.StructField("enclosed_message_types", T.StringType(), True),
        T.StructField("message_intent", T.StringType(), True),
        T.StructField("conversation_id", T.StringType(), True),
        T.StructField("correlation_id", T.StringType(), True),
        T.StructField("sending_endpoint", T.StringType(), True),
        T.StructField("processing_endpoint", T.StringType(), True),
        T.StructField("processing_machine", T.StringType(), True),
        T.StructField("time_sent", T.TimestampType(), True),
        T.StructField("processing_started", T.TimestampType(), True),
        T.StructField("processing_ended", T.TimestampType(), True),
        T.StructField("processing_time_ms", T.DoubleType(), True),
        T.StructField("critical_time_ms", T.DoubleType(), True),
        T.StructField("failed_queue", T.StringType(), True),
        T.StructField("time_of_failure", T.TimestampType(), True),
        T.StructField("exception_type", T.StringType(), True),
        T.StructField("exception_message", T.StringType(), True),
        T.StructField("event_time", T.TimestampType(), False),
        T.StructField("headers", T.MapType(T.StringType(), T.StringType()), True),
        T.StructField("raw_headers", T.StringType(), False),
        T.StructField("headers_error", T.StringType(), True),
        T.StructField("body", T.BinaryType(), True),
        T.StructField("ingested_at", T.TimestampType(), False),
        T.StructField("date", T.DateType(), False),
    ]
)

_CLAIM_SCHEMA = T.StructType(
    [
        T.StructField("row_version", T.LongType(), False),
        T.StructField("native_id", T.StringType(), False),
    ]
)

#: Spark pattern of the NServiceBus wire timestamp ``yyyy-MM-dd HH:mm:ss:ffffff Z``.
WIRE_TIME_PATTERN = "yyyy-MM-dd HH:mm:ss:SSSSSS X"

#: Namespace of keyed message ids: ``uuid5(SEND_NAMESPACE, destination + "\n" + key)``.
SEND_NAMESPACE = uuid.UUID("a3d52c4e-8f0b-5b7e-9d61-3c2f7e1a9b04")

#: Default rows per send transaction of :func:`send_dataframe`.
SEND_BATCH_SIZE = 1_000
#: Default rows per ingested batch (one Parquet commit, one delete transaction).
INGEST_BATCH_SIZE = 10_000
#: Largest batch :func:`ingest` takes (the driver holds one batch's keys, ~60 bytes a row).
MAX_INGEST_BATCH_SIZE = 1_000_000
#: Parameters per IN list (SQL Server takes at most 2100 in a statement).
_IN_CHUNK = 1_000
_SEND_ATTEMPTS = 5

#: Test seam: ``SQLQUEUE_SPARK_TEST_KILL_AT=<point>:<n>`` SIGKILLs the ingesting process when
#: batch *n* of the run reaches *point* (``written``, ``committed``, ``moved``, ``deleted``).
KILL_AT_ENV = "SQLQUEUE_SPARK_TEST_KILL_AT"

_STATE_DIR = "_sqlqueue"


class IngestError(exceptions.SqlQueueError):
    """An ingestion could not go on; nothing was lost (re-run it to finish)."""


class IngestInProgress(IngestError):
    """Another ingestion of this queue is running."""


# -- sessions ----------------------------------------------------------------------------------
def spark_session(master: str = "local[*]", app_name: str = "sqlqueue") -> SparkSession:
    """Get or create a SparkSession whose Python workers run this interpreter.

    On a ``local`` master it also binds to 127.0.0.1, turns the UI off and keeps shuffle
    partitions small; on a cluster, configure the session as usual (``spark-submit``).

    :param master: the Spark master URL.
    :param app_name: the application name.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.ui.enabled", "false").config(
            "spark.sql.shuffle.partitions", str(max(4, 2 * (os.cpu_count() or 2)))
        )
    return builder.getOrCreate()


# -- shared helpers ----------------------------------------------------------------------------
def _check_url(url: str) -> sa.URL:
    if not isinstance(url, str):
        raise exceptions.ConfigurationError(
            f"Spark tasks connect by URL string; got {url!r} (pass engine.url.render_as_string())"
        )
    try:
        parsed = sa.make_url(url)
    except Exception as error:  # any parse failure: say which URL
        raise exceptions.ConfigurationError(f"cannot use database URL {url!r}: {error}") from error
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise exceptions.ConfigurationError(
            f"database URL {url!r} is an in-memory SQLite database, which Spark tasks (other "
            "processes) cannot open; use a file: sqlite:///path/to/file.db"
        )
    return parsed


def _check_positive(name: str, value: object, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise exceptions.ConfigurationError(f"{name} {value!r} must be a positive integer")
    if maximum is not None and value > maximum:
        raise exceptions.ConfigurationError(f"{name} {value!r} must be at most {maximum}")
    return value


def _task_engine(url: str) -> sa.Engine:
    """An engine for one Spark task: no pool to outlive the task."""
    return db.create_engine(url, poolclass=sa.pool.NullPool)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _quote_column(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def _require_queue(engine: sa.Engine, address: addressing.QueueAddress) -> None:
    with db.wrap_db_errors(str(address)), engine.connect() as connection:
        found = db.column_names(connection, address)
    if not found:
        raise exceptions.QueueNotFound(str(address))


# -- send_dataframe --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SendResult:
    """What :func:`send_dataframe` did: messages *sent*, rows *skipped* (already in the ledger)."""

    destination: str
    sent: int
    skipped: int


def message_id_for(destination: str, key: str) -> str:
    """The deterministic NServiceBus.MessageId of the row with *key* sent to *destination*."""
    return str(uuid.uuid5(SEND_NAMESPACE, f"{destination}\n{key}"))


@dataclasses.dataclass(frozen=True)
class _SendPlan:
    """Everything a send task needs; pickled to the executors."""

    url: str
    destination: str
    default_schema: str | None
    key_column: str | None
    constant_headers: tuple[tuple[str, str], ...]
    header_names: tuple[str, ...]
    batch_size: int


def _body_expression(df: DataFrame, body_column: str | None) -> tuple[Column, str | None]:
    """The body as a binary/string column, and the content type it implies."""
    if body_column is None:
        whole_row = F.struct(*[_quote_column(name) for name in df.columns])
        return F.to_json(whole_row), "application/json"
    if body_column not in df.columns:
        raise exceptions.ConfigurationError(
            f"body column {body_column!r} is not in the DataFrame; its columns are {df.columns}"
        )
    data_type = df.schema[body_column].dataType
    column = _quote_column(body_column)
    if isinstance(data_type, T.BinaryType | T.StringType):
        return column, None
    if isinstance(data_type, T.StructType | T.MapType | T.ArrayType):
        return F.to_json(column), "application/json"
    raise exceptions.ConfigurationError(
        f"body column {body_column!r} is {data_type.simpleString()}; use binary, string, or a "
        "struct, map or array (sent as JSON)"
    )


def send_dataframe(
    df: DataFrame,
    destination: str,
    url: str,
    *,
    body_column: str | None = None,
    key_column: str | None = None,
    headers: Mapping[str, str] | None = None,
    header_columns: Mapping[str, str] | None = None,
    batch_size: int = SEND_BATCH_SIZE,
    default_schema: str | None = None,
) -> SendResult:
    r"""Send one message per row of *df* to the queue *destination*.

    Each partition sends over its own connection, in transactions of *batch_size* messages, in
    the NServiceBus wire format. ``NServiceBus.MessageIntent`` (``Send``),
    ``CorrelationId`` (the message id) and ``ConversationId`` are set unless given.

    :param df: the rows.
    :param destination: the queue address (``table@[schema]``); it must exist.
    :param url: the database URL; every Spark task connects with it.
    :param body_column: binary (as is), string (UTF-8) or struct/map/array (JSON, with
        ``NServiceBus.ContentType: application/json``); ``None``: the whole row as JSON.
    :param key_column: a column identifying the row (cast to string, never null). The message id
        becomes ``uuid5(SEND_NAMESPACE, destination + "\n" + key)`` and sends are recorded in
        ``SparkSendLedger``, so a re-run skips keys already sent: exactly once per key while the
        ledger row exists. Without it each run sends every row (at least once).
    :param headers: constant headers of every message.
    :param header_columns: header name -> column; a null value leaves the header out.
    :param batch_size: messages per transaction.
    :param default_schema: schema of a destination that names none.
    :raises ConfigurationError: naming a missing column, a bad header or batch size.
    :raises QueueNotFound: if *destination* does not exist.
    """
    _check_url(url)
    _check_positive("batch_size", batch_size)
    constant = dict(headers or {})
    for key, value in constant.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise exceptions.ConfigurationError(
                f"header {key!r}: {value!r}: header names and values must be strings"
            )
    mapped = dict(header_columns or {})
    for name, column in mapped.items():
        if column not in df.columns:
            raise exceptions.ConfigurationError(
                f"header {name!r} comes from column {column!r}, which is not in the DataFrame; "
                f"its columns are {df.columns}"
            )
    if key_column is not None:
        if key_column not in df.columns:
            raise exceptions.ConfigurationError(
                f"key column {key_column!r} is not in the DataFrame; its columns are {df.columns}"
            )
        if nsb_headers.MESSAGE_ID in constant or nsb_headers.MESSAGE_ID in mapped:
            raise exceptions.ConfigurationError(
                f"key column {key_column!r} makes the {nsb_headers.MESSAGE_ID} header; do not also "
                "give it as a header"
            )
    body, content_type = _body_expression(df, body_column)
    if content_type is not None:
        constant.setdefault(nsb_headers.CONTENT_TYPE, content_type)

    with transport_module.Transport(url, default_schema=default_schema) as transport:
        address = transport.address(destination)
        _require_queue(transport.engine, address)
        if key_column is not None:
            if len(str(address)) > spark_ledger.MAX_DESTINATION_LENGTH:
                raise exceptions.ConfigurationError(
                    f"destination {str(address)!r} is longer than "
                    f"{spark_ledger.MAX_DESTINATION_LENGTH} characters, the most the send ledger "
                    "records; send without a key column"
                )
            with db.wrap_db_errors(), transport.engine.begin() as connection:
                _ledger_table().create(connection, checkfirst=True)

    plan = _SendPlan(
        url=url,
        destination=str(address),
        default_schema=default_schema,
        key_column=key_column,
        constant_headers=tuple(constant.items()),
        header_names=tuple(mapped),
        batch_size=batch_size,
    )
    key_value = (
        _quote_column(key_column).cast("string") if key_column is not None else F.lit(None)
    ).alias("key")
    projected = df.select(
        body.alias("body"),
        key_value,
        *[
            _quote_column(column).cast("string").alias(f"h{i}")
            for i, column in enumerate(mapped.values())
        ],
    )
    log.info("queue %s: sending a message per row over %d partition(s)",
             plan.destination, projected.rdd.getNumPartitions())
    counts = projected.rdd.mapPartitions(functools.partial(_send_partition, plan)).collect()
    sent = sum(item[0] for item in counts)
    skipped = sum(item[1] for item in counts)
    log.info("queue %s: sent %d message(s), skipped %d already sent",
             plan.destination, sent, skipped)
    return SendResult(plan.destination, sent, skipped)


def _ledger_table() -> sa.Table:
    return cast(sa.Table, spark_ledger.SparkSendLedger.__table__)


def _send_partition(plan: _SendPlan, rows: Iterator[Row]) -> Iterator[tuple[int, int]]:
    """Send one partition in batches over its own connection; yield (sent, skipped)."""
    engine = _task_engine(plan.url)
    transport = transport_module.Transport(
        engine, default_schema=plan.default_schema, verify_schema=False
    )
    sent = skipped = 0
    try:
        for batch in _chunks(rows, plan.batch_size):
            messages = [_to_message(plan, row) for row in batch]
            done, already = _send_batch(engine, transport, plan, messages)
            sent += done
            skipped += already
    finally:
        engine.dispose()
    yield sent, skipped


def _to_message(plan: _SendPlan, row: Row) -> OutgoingMessage:
    values = dict(plan.constant_headers)
    for name, value in zip(plan.header_names, row[2:], strict=True):
        if value is not None:
            values[name] = value
    if plan.key_column is not None:
        if row[1] is None:
            raise exceptions.InvalidMessage(
                f"queue {plan.destination!r}: key column {plan.key_column!r} is null in a row; "
                "every row needs a key to be sent exactly once"
            )
        message_id = message_id_for(plan.destination, row[1])
    else:
        message_id = values.get(nsb_headers.MESSAGE_ID) or str(uuid.uuid4())
    values[nsb_headers.MESSAGE_ID] = message_id
    values.setdefault(nsb_headers.MESSAGE_INTENT, "Send")
    values.setdefault(nsb_headers.CORRELATION_ID, message_id)
    values.setdefault(nsb_headers.CONVERSATION_ID, str(uuid.uuid4()))
    body = row[0]
    if isinstance(body, bytearray):
        body = bytes(body)
    return OutgoingMessage(body=body, headers=values, message_id=message_id)


def _send_batch(
    engine: sa.Engine,
    transport: transport_module.Transport,
    plan: _SendPlan,
    messages: list[OutgoingMessage],
) -> tuple[int, int]:
    """Send one batch (and record it in the ledger) in one transaction; retry transient errors."""
    if plan.key_column is None:
        transport.send_many(plan.destination, messages)
        return len(messages), 0
    unique: dict[str, OutgoingMessage] = {}
    for message in messages:
        unique.setdefault(str(message.message_id), message)  # a key twice in the data: once
    ledger = _ledger_table()
    for attempt in range(1, _SEND_ATTEMPTS + 1):
        try:
            with engine.begin() as connection:
                sent_before: set[str] = set()
                for chunk in _chunks(unique, _IN_CHUNK):
                    sent_before.update(
                        connection.execute(
                            sa.select(ledger.c.MessageId).where(
                                ledger.c.Destination == plan.destination,
                                ledger.c.MessageId.in_(chunk),
                            )
                        ).scalars()
                    )
                todo = [message for key, message in unique.items() if key not in sent_before]
                if todo:
                    transport.send_many(plan.destination, todo, connection=connection)
                    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
                    connection.execute(
                        ledger.insert(),
                        [
                            {"Destination": plan.destination, "MessageId": message.message_id,
                             "SentAt": now}
                            for message in todo
                        ],
                    )
            return len(todo), len(messages) - len(todo)
        except (sa.exc.IntegrityError, sa.exc.OperationalError, exceptions.DatabaseError) as error:
            # A concurrent task (speculative copy, duplicate key elsewhere) recorded some of
            # these first, or a deadlock/lock timeout: the transaction rolled back; look again.
            transient = isinstance(error, sa.exc.IntegrityError) or db.is_transient(error)
            if not transient or attempt == _SEND_ATTEMPTS:
                raise
            log.info("queue %s: send batch failed (%s); retry %d", plan.destination, error, attempt)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


# -- ingest: parsing (pure) ------------------------------------------------------------------
def _header(name: str) -> Column:
    return F.try_element_at(F.col("headers"), F.lit(name))


def _wire_time(name: str) -> Column:
    return F.try_to_timestamp(_header(name), F.lit(WIRE_TIME_PATTERN))


def _millis_between(start: Column, end: Column) -> Column:
    return (F.unix_micros(end) - F.unix_micros(start)) / F.lit(1000.0)


def parse_messages(
    raw: DataFrame, queue: str, ingested_at: dt.datetime, *, include_body: bool = True
) -> DataFrame:
    """Queue rows (:data:`QUEUE_ROW_SCHEMA`) -> dataset rows (:data:`DATASET_SCHEMA`).

    Headers are parsed with built-in functions only. ``message_type`` is the first type of
    ``NServiceBus.EnclosedMessageTypes`` without its assembly; processing time is
    ProcessingEnded - ProcessingStarted and critical time ProcessingEnded - TimeSent (as
    NServiceBus defines them). ``event_time`` is ProcessingEnded, else TimeOfFailure, else
    TimeSent, else *ingested_at*; ``date`` is its UTC date. Rows whose headers are not a JSON
    object keep them in ``raw_headers`` with ``headers_error`` set.

    :param raw: queue rows.
    :param queue: the queue name stored in each row.
    :param ingested_at: when the batch was read (aware or naive UTC).
    :param include_body: keep the body (``False``: null bodies, a much smaller dataset).
    """
    if ingested_at.tzinfo is None:
        ingested_at = ingested_at.replace(tzinfo=dt.UTC)
    ingested_micros = int(ingested_at.timestamp()) * 1_000_000 + ingested_at.microsecond
    ingested = F.timestamp_micros(F.lit(ingested_micros))
    first_type = F.split(_header(nsb_headers.ENCLOSED_MESSAGE_TYPES), ";").getItem(0)
    types = F.trim(F.split(first_type, ",").getItem(0))
    parsed = raw.withColumn(
        "headers", F.from_json(F.col("raw_headers"), T.MapType(T.StringType(), T.StringType()))
    )
    parsed = parsed.select(
        F.lit(queue).alias("queue"),
        F.col("native_id"),
        F.col("row_version"),
        F.coalesce(_header(nsb_headers.MESSAGE_ID), F.col("native_id")).alias("message_id"),
        F.when(types != "", types).alias("message_type"),
        _header(nsb_headers.ENCLOSED_MESSAGE_TYPES).alias("enclosed_message_types"),
        _header(nsb_headers.MESSAGE_INTENT).alias("message_intent"),
        _header(nsb_headers.CONVERSATION_ID).alias("conversation_id"),
        _header(nsb_headers.CORRELATION_ID).alias("correlation_id"),
        _header(nsb_headers.ORIGINATING_ENDPOINT).alias("sending_endpoint"),
        _header(nsb_headers.PROCESSING_ENDPOINT).alias("processing_endpoint"),
        _header(nsb_headers.PROCESSING_MACHINE).alias("processing_machine"),
        _wire_time(nsb_headers.TIME_SENT).alias("time_sent"),
        _wire_time(nsb_headers.PROCESSING_STARTED).alias("processing_started"),
        _wire_time(nsb_headers.PROCESSING_ENDED).alias("processing_ended"),
        _header(nsb_headers.FAILED_QUEUE).alias("failed_queue"),
        _wire_time(nsb_headers.TIME_OF_FAILURE).alias("time_of_failure"),
        _header(nsb_headers.EXCEPTION_TYPE).alias("exception_type"),
        _header(nsb_headers.EXCEPTION_MESSAGE).alias("exception_message"),
        F.col("headers"),
        F.col("raw_headers"),
        F.when(F.col("headers").isNull(), F.lit("headers are not a JSON object of strings"))
        .alias("headers_error"),
        (F.col("body") if include_body else F.lit(None).cast(T.BinaryType())).alias("body"),
        ingested.alias("ingested_at"),
    )
    parsed = parsed.withColumn(
        "processing_time_ms",
        _millis_between(F.col("processing_started"), F.col("processing_ended")),
    ).withColumn(
        "critical_time_ms", _millis_between(F.col("time_sent"), F.col("processing_ended"))
    ).withColumn(
        "event_time",
        F.coalesce("processing_ended", "time_of_failure", "time_sent", "ingested_at"),
    )
    parsed = parsed.withColumn(
        "date", F.date_from_unix_date(F.floor(F.unix_micros("event_time") / F.lit(86_400_000_000)))
    )
    return parsed.select(
        *[F.col(field.name).cast(field.dataType) for field in DATASET_SCHEMA.fields]
    )


# -- ingest: the single-ingester lock --------------------------------------------------------
class _IngestLock:
    """Exclusive right to ingest one queue; the server (or kernel) frees it if we die."""

    def __init__(self, engine: sa.Engine, url: sa.URL, address: addressing.QueueAddress) -> None:
        self.engine = engine
        self.url = url
        self.address = address
        # sp_getapplock takes at most 255 characters: the digest keeps a cut name unique.
        self.resource = f"sqlqueue_orm:spark-ingest:{_digest(str(address))}:{address}"[:255]
        self._connection: sa.Connection | None = None
        self._fd: int | None = None

    def __enter__(self) -> _IngestLock:
        name = self.engine.dialect.name
        busy = IngestInProgress(
            f"queue {str(self.address)!r}: another ingestion of this queue is running "
            f"(lock {self.resource!r}); wait for it to end"
        )
        if name == "sqlite":
            import fcntl

            path = f"{self.url.database}.ingest-{_digest(str(self.address))}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise busy from None
            self._fd = fd
            return self
        connection = self.engine.connect()
        try:
            with db.wrap_db_errors(str(self.address)):
                status = connection.execute(
                    lock_statement(name), {"resource": self.resource}
                ).scalar()
                connection.commit()
            got = status is True or (
                status is not None and not isinstance(status, bool) and int(status) >= 0
            )
        except BaseException:
            connection.close()
            raise
        if not got:
            connection.close()
            raise busy
        self._connection = connection
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            if connection.dialect.name == "mssql":
                connection.execute(
                    sa.text(
                        "EXEC sp_releaseapplock @Resource = :resource, @LockOwner = 'Session'"
                    ),
                    {"resource": self.resource},
                )
            else:
                connection.execute(
                    sa.text("SELECT pg_advisory_unlock(hashtextextended(:resource, 0))"),
                    {"resource": self.resource},
                )
            connection.commit()
        except sa.exc.DBAPIError as error:
            log.warning("queue %s: could not release the ingest lock: %s", self.address, error)
        finally:
            connection.close()


def lock_statement(dialect_name: str) -> sa.TextClause:
    """The statement taking the session-scoped ingest lock without waiting.

    Its scalar tells whether it got it (PostgreSQL: a boolean; SQL Server: sp_getapplock's
    status, >= 0 when granted).
    """
    if dialect_name == "mssql":
        # Session owner: held across transactions until released or the connection drops.
        return sa.text(
            "DECLARE @status int; "
            "EXEC @status = sp_getapplock @Resource = :resource, @LockMode = 'Exclusive', "
            "@LockOwner = 'Session', @LockTimeout = 0; SELECT @status"
        )
    if dialect_name == "postgresql":
        return sa.text("SELECT pg_try_advisory_lock(hashtextextended(:resource, 0))")
    raise exceptions.ConfigurationError(
        f"database dialect {dialect_name!r} is not supported; use sqlite, postgresql or mssql"
    )


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:10]


def _slug(address: addressing.QueueAddress) -> str:
    """A file-name-safe, unique prefix of this queue's batches."""
    readable = re.sub(r"[^A-Za-z0-9]+", "_", str(address)).strip("_")[:40] or "queue"
    return f"{readable}-{_digest(str(address))}"


# -- ingest: files (Hadoop FileSystem of the dataset path) ----------------------------------
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

    def exists(self, path: Any) -> bool:
        """Whether *path* exists."""
        return bool(self.fs.exists(path))

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


# -- ingest ------------------------------------------------------------------------------------
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


def _claim(
    engine: sa.Engine, table: sa.Table, address: addressing.QueueAddress, batch_size: int
) -> list[tuple[int, str]]:
    """The (RowVersion, Id) of the oldest *batch_size* committed rows; nothing is deleted."""
    with db.wrap_db_errors(str(address)), engine.begin() as connection:
        rows = connection.execute(claim_statement(table, batch_size)).all()
    return [(int(row_version), str(native_id)) for row_version, native_id in rows]


def claim_statement(table: sa.Table, batch_size: int) -> sa.Select[Any]:
    """SELECT the oldest rows' keys; SQL Server skips rows still being inserted (READPAST)."""
    return (
        sa.select(table.c.RowVersion, table.c.Id)
        .order_by(table.c.RowVersion)
        .limit(batch_size)
        .with_hint(table, "WITH (READPAST, READCOMMITTEDLOCK)", "mssql")
    )


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
    engine = _task_engine(url)
    table = queue_table(table_name, schema, engine)
    statement = sa.select(table.c.Id, table.c.RowVersion, table.c.Headers, table.c.Body)
    try:
        for chunk in _chunks(sorted(wanted), _IN_CHUNK):
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
    raw = spark.createDataFrame(rows, QUEUE_ROW_SCHEMA)
    parsed = parse_messages(raw, str(address), ingested_at, include_body=include_body)
    parsed.write.mode("overwrite").partitionBy("date").parquet(files.uri(staging))
    _kill_point("written", number)
    # What the files hold, read back from them: exactly these rows will leave the queue.
    written = (
        spark.read.schema(DATASET_SCHEMA).parquet(files.uri(staging))
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
    parsed_url = _check_url(url)
    _check_positive("batch_size", batch_size, MAX_INGEST_BATCH_SIZE)
    if partitions is not None:
        _check_positive("partitions", partitions)
    if max_batches is not None:
        _check_positive("max_batches", max_batches)
    address = addressing.QueueAddress.coerce(queue)
    if address.catalog is not None:
        raise exceptions.ConfigurationError(
            f"queue {str(address)!r} is in another catalog; ingest it with that database's URL"
        )
    table = queue_table(address.table, address.schema, parsed_url.get_backend_name())
    files = _Files(spark, path)
    slices = partitions or spark.sparkContext.defaultParallelism
    engine = db.create_engine(url)
    messages = batches = 0
    try:
        _require_queue(engine, address)
        with _IngestLock(engine, parsed_url, address):
            recovered, recovered_messages = _recover(files, engine, table, address)
            while max_batches is None or batches < max_batches:
                claims = _claim(engine, table, address, batch_size)
                if not claims:
                    break
                batches += 1
                manifest = _ingest_batch(
                    spark, files, url, address, claims, batches, slices, include_body
                )
                _finish_batch(files, engine, table, address, manifest, batches)
                messages += len(manifest["rows"])
                if len(claims) < batch_size:
                    break
    finally:
        engine.dispose()
    log.info("queue %s: ingested %d message(s) in %d batch(es) into %s",
             address, messages, batches, files.uri(files.root))
    return IngestResult(
        str(address), files.uri(files.root), messages, batches, recovered, recovered_messages
    )


# -- report (pure functions) -------------------------------------------------------------------
PERCENTILES = (0.5, 0.95, 0.99)
#: Relative accuracy of the approximate percentiles is 1 / this.
PERCENTILE_ACCURACY = 10_000


def _failed() -> Column:
    return F.col("exception_type").isNotNull() | F.col("failed_queue").isNotNull()


def _percentiles(column: Column, exact: bool) -> Column:
    if exact:
        return F.percentile(column, list(PERCENTILES))
    return F.percentile_approx(column, list(PERCENTILES), PERCENTILE_ACCURACY)


def _percentile_columns(frame: DataFrame, name: str, prefix: str) -> list[Column]:
    return [
        F.col(name).getItem(i).alias(f"{prefix}_p{round(p * 100)}_ms")
        for i, p in enumerate(PERCENTILES)
    ]


def summary(dataset: DataFrame, *, exact: bool = False) -> DataFrame:
    """Per message type and processing endpoint: counts, average throughput and percentiles.

    Columns: message_type, processing_endpoint, processed, failed, first, last,
    per_second (processed / seconds from first to last, at least one second),
    processing_p50_ms .. _p99_ms and critical_p50_ms .. _p99_ms over processed messages.

    :param dataset: rows of :data:`DATASET_SCHEMA`.
    :param exact: exact percentiles (linear interpolation, all values of a group in memory);
        by default approximate ones (nearest rank within 1/10,000 of the count).
    """
    processed = ~_failed()
    grouped = dataset.groupBy("message_type", "processing_endpoint").agg(
        F.count(F.when(processed, 1)).alias("processed"),
        F.count(F.when(_failed(), 1)).alias("failed"),
        F.min(F.when(processed, F.col("event_time"))).alias("first"),
        F.max(F.when(processed, F.col("event_time"))).alias("last"),
        _percentiles(F.when(processed, F.col("processing_time_ms")), exact).alias("processing"),
        _percentiles(F.when(processed, F.col("critical_time_ms")), exact).alias("critical"),
    )
    span = F.greatest(
        (F.unix_micros("last") - F.unix_micros("first")) / F.lit(1_000_000.0), F.lit(1.0)
    )
    return grouped.select(
        "message_type",
        "processing_endpoint",
        "processed",
        "failed",
        "first",
        "last",
        (F.col("processed") / span).alias("per_second"),
        *_percentile_columns(grouped, "processing", "processing"),
        *_percentile_columns(grouped, "critical", "critical"),
    ).orderBy(F.col("processed").desc(), "message_type", "processing_endpoint")


def throughput(
    dataset: DataFrame,
    bucket_seconds: int,
    *,
    by: Sequence[str] = (),
    exact: bool = False,
) -> DataFrame:
    """Messages per time bucket (of ``event_time``), optionally per *by* columns.

    Columns: bucket_start (timestamp), bucket_epoch (seconds), *by, processed, failed,
    per_second, processing_p95_ms, critical_p95_ms.

    :param dataset: rows of :data:`DATASET_SCHEMA`.
    :param bucket_seconds: bucket width; buckets start at multiples of it since the epoch.
    :param by: extra grouping columns, e.g. ``("processing_endpoint",)``.
    :param exact: exact percentiles instead of approximate ones.
    """
    _check_positive("bucket_seconds", bucket_seconds)
    width = bucket_seconds * 1_000_000
    micros = F.unix_micros("event_time")
    start = micros - F.pmod(micros, F.lit(width))
    processed = ~_failed()
    p95: Any = (
        functools.partial(F.percentile, percentage=0.95)
        if exact
        else functools.partial(F.percentile_approx, percentage=0.95, accuracy=PERCENTILE_ACCURACY)
    )
    grouped = dataset.withColumn("bucket_micros", start).groupBy("bucket_micros", *by).agg(
        F.count(F.when(processed, 1)).alias("processed"),
        F.count(F.when(_failed(), 1)).alias("failed"),
        p95(F.when(processed, F.col("processing_time_ms"))).alias("processing_p95_ms"),
        p95(F.when(processed, F.col("critical_time_ms"))).alias("critical_p95_ms"),
    )
    return grouped.select(
        F.timestamp_micros("bucket_micros").alias("bucket_start"),
        (F.col("bucket_micros") / F.lit(1_000_000)).cast("long").alias("bucket_epoch"),
        *by,
        "processed",
        "failed",
        (F.col("processed") / F.lit(float(bucket_seconds))).alias("per_second"),
        F.col("processing_p95_ms").cast("double").alias("processing_p95_ms"),
        F.col("critical_p95_ms").cast("double").alias("critical_p95_ms"),
    ).orderBy("bucket_epoch", *by)


def failures(dataset: DataFrame) -> DataFrame:
    """Failed messages by exception type: failures, message types, first and last failure."""
    failed = dataset.where(_failed())
    exception_type = F.coalesce("exception_type", F.lit("(unknown)")).alias("exception_type")
    return failed.groupBy(exception_type).agg(
        F.count(F.lit(1)).alias("failures"),
        F.array_sort(F.collect_set("message_type")).alias("message_types"),
        F.min(F.coalesce("time_of_failure", "event_time")).alias("first_failure"),
        F.max(F.coalesce("time_of_failure", "event_time")).alias("last_failure"),
    ).orderBy(F.col("failures").desc(), "exception_type")


#: Bucket widths :func:`choose_bucket` picks from, in seconds.
BUCKETS = (1, 5, 10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 86_400, 7 * 86_400)


def choose_bucket(span_seconds: float, target: int = 120) -> int:
    """The smallest bucket of :data:`BUCKETS` giving at most *target* buckets over the span."""
    for width in BUCKETS:
        if span_seconds / width <= target:
            return width
    return BUCKETS[-1]


@dataclasses.dataclass(frozen=True)
class Report:
    """The report's DataFrames (small: one row per group or bucket) and its bucket width."""

    summary: DataFrame
    throughput: DataFrame
    throughput_by_endpoint: DataFrame
    failures: DataFrame
    bucket_seconds: int
    messages: int


def read_dataset(spark: SparkSession, path: str | Sequence[str]) -> DataFrame:
    """Read an ingested dataset with :data:`DATASET_SCHEMA`.

    :raises ConfigurationError: if there is no dataset at *path*.
    """
    paths = [path] if isinstance(path, str) else list(path)
    try:
        return spark.read.schema(DATASET_SCHEMA).parquet(*paths)
    except Exception as error:  # AnalysisException: the path does not exist
        raise exceptions.ConfigurationError(
            f"no ingested dataset at {paths}: {str(error).splitlines()[0]}"
        ) from error


def report(
    spark: SparkSession,
    path: str | Sequence[str],
    *,
    bucket_seconds: int | None = None,
    exact: bool = False,
) -> Report:
    """Report on the dataset(s) at *path*: :func:`summary`, :func:`throughput`, :func:`failures`.

    :param spark: the session.
    :param path: one dataset directory or several.
    :param bucket_seconds: throughput bucket width (default: chosen for ~120 buckets).
    :param exact: exact percentiles (default: approximate, for large data).
    """
    dataset = read_dataset(spark, path)
    bounds = dataset.agg(
        F.count(F.lit(1)).alias("n"),
        F.min(F.unix_micros("event_time")).alias("lo"),
        F.max(F.unix_micros("event_time")).alias("hi"),
    ).first()
    count = int(bounds["n"]) if bounds is not None else 0
    if bucket_seconds is None:
        span = 0.0 if not count else (int(bounds["hi"]) - int(bounds["lo"])) / 1e6  # type: ignore[index]
        bucket_seconds = choose_bucket(span)
    return Report(
        summary=summary(dataset, exact=exact),
        throughput=throughput(dataset, bucket_seconds, exact=exact),
        throughput_by_endpoint=throughput(
            dataset, bucket_seconds, by=("processing_endpoint",), exact=exact
        ),
        failures=failures(dataset),
        bucket_seconds=bucket_seconds,
        messages=count,
    )
