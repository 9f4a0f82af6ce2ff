"""Reports on an ingested dataset: :func:`summary`, :func:`throughput`, :func:`failures`.

They are pure DataFrame -> DataFrame functions over rows of
:data:`~sqlqueue_orm.contrib.spark.dataset.DATASET_SCHEMA`, aggregated with Spark SQL; their
results are small (one row per group or time bucket). :func:`report` runs them all on a path.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from sqlqueue_orm.contrib.spark import checks
from sqlqueue_orm.contrib.spark import dataset as dataset_module

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

PERCENTILES = (0.5, 0.95, 0.99)
#: Relative accuracy of the approximate percentiles is 1 / this.
PERCENTILE_ACCURACY = 10_000


def _failed() -> Column:
    return F.col("exception_type").isNotNull() | F.col("failed_queue").isNotNull()


def _percentiles(column: Column, exact: bool) -> Column:
    if exact:
        return F.percentile(column, list(PERCENTILES))
    return F.percentile_approx(column, list(PERCENTILES), PERCENTILE_ACCURACY)


def _percentile_columns(name: str, prefix: str) -> list[Column]:
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
        *_percentile_columns("processing", "processing"),
        *_percentile_columns("critical", "critical"),
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
    checks.check_positive("bucket_seconds", bucket_seconds)
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
    dataset = dataset_module.read_dataset(spark, path)
    bounds = dataset.agg(
        F.count(F.lit(1)).alias("n"),
        F.min(F.unix_micros("event_time")).alias("lo"),
        F.max(F.unix_micros("event_time")).alias("hi"),
    ).first()
    count = int(bounds["n"]) if bounds is not None else 0
    if bucket_seconds is None:
        span = 0.0 if not count else (int(bounds["hi"]) - int(bounds["lo"])) / 1e6  # type: ignore[index]
        bucket_seconds = choose_bucket(span)
    log.info("report on %s: %d message(s), throughput in buckets of %d s",
             path, count, bucket_seconds)
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
