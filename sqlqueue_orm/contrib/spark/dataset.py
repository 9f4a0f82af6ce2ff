"""The ingested dataset: its schema, how queue rows become dataset rows, how to read it back.

:func:`parse_messages` is a pure DataFrame -> DataFrame function with explicit schemas
(:data:`QUEUE_ROW_SCHEMA` in, :data:`DATASET_SCHEMA` out), mirrored from the queue table's
columns and the NServiceBus headers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from sqlqueue_orm import exceptions
from sqlqueue_orm import headers as nsb_headers

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

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

#: Spark pattern of the NServiceBus wire timestamp ``yyyy-MM-dd HH:mm:ss:ffffff Z``.
WIRE_TIME_PATTERN = "yyyy-MM-dd HH:mm:ss:SSSSSS X"


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


def _wire_time_or_none(values: dict[str, str | None], name: str) -> dt.datetime | None:
    text = values.get(name)
    if text is None:
        return None
    try:
        return nsb_headers.parse_time(text)
    except ValueError:
        return None


def _millis(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return ((end - start) // dt.timedelta(microseconds=1)) / 1000.0


def parse_row(
    queue: str,
    native_id: str,
    row_version: int,
    raw: object,
    body: bytes | None,
    ingested_at: dt.datetime,
) -> tuple[object, ...]:
    """One queue row -> one dataset row (a tuple in :data:`DATASET_SCHEMA` order), in Python.

    What the streaming source yields per message: the same definitions as
    :func:`parse_messages` (first enclosed type without its assembly, NServiceBus's processing
    and critical times, ``event_time`` and its UTC ``date``). Headers that cannot be read are
    kept in ``raw_headers`` with ``headers_error`` saying why; nothing is dropped.

    :param ingested_at: when the row was read (aware UTC).
    """
    values, kept, error = nsb_headers.decode(raw)
    raw_text = kept if isinstance(kept, str) else kept.decode("utf-8", "replace")
    enclosed = values.get(nsb_headers.ENCLOSED_MESSAGE_TYPES)
    message_type = None
    if enclosed is not None:
        message_type = enclosed.split(";")[0].split(",")[0].strip() or None
    time_sent = _wire_time_or_none(values, nsb_headers.TIME_SENT)
    started = _wire_time_or_none(values, nsb_headers.PROCESSING_STARTED)
    ended = _wire_time_or_none(values, nsb_headers.PROCESSING_ENDED)
    failed_at = _wire_time_or_none(values, nsb_headers.TIME_OF_FAILURE)
    event_time = ended or failed_at or time_sent or ingested_at
    message_id = values.get(nsb_headers.MESSAGE_ID)
    return (
        queue,
        native_id,
        row_version,
        native_id if message_id is None else message_id,
        message_type,
        enclosed,
        values.get(nsb_headers.MESSAGE_INTENT),
        values.get(nsb_headers.CONVERSATION_ID),
        values.get(nsb_headers.CORRELATION_ID),
        values.get(nsb_headers.ORIGINATING_ENDPOINT),
        values.get(nsb_headers.PROCESSING_ENDPOINT),
        values.get(nsb_headers.PROCESSING_MACHINE),
        time_sent,
        started,
        ended,
        _millis(started, ended),
        _millis(time_sent, ended),
        values.get(nsb_headers.FAILED_QUEUE),
        failed_at,
        values.get(nsb_headers.EXCEPTION_TYPE),
        values.get(nsb_headers.EXCEPTION_MESSAGE),
        event_time,
        None if error else values,
        raw_text,
        error,
        body,
        ingested_at,
        event_time.astimezone(dt.UTC).date(),
    )
