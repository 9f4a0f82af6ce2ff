"""``sqlqueue spark send|ingest|report|sample``: the Spark pipelines from the command line.

PySpark is imported only when a Spark command runs (``sample`` needs none), so ``sqlqueue``
works without the ``spark`` extra: each command imports the :mod:`sqlqueue_orm.contrib.spark`
module it runs when it runs; only ``checks``, which needs no Spark, is imported with this one.

Each command checks its inputs before it starts Spark (the queue exists, the input or dataset
is there and readable, numbers in range, the database can be reached): a mistake exits 2 with
one line naming the value, an unreachable database exits 1 with one line naming the host and
the cause, both before a JVM would have started.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import logging
import os
import re
import signal
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import arguments
from sqlqueue_orm.contrib.spark import checks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Under ``sqlqueue_orm.contrib.spark``, whose level a Spark command raises to INFO: the line
# saying a stream stops on a signal shows by default, as the progress lines do.
log = logging.getLogger("sqlqueue_orm.contrib.spark.commands")

_FORMATS = ("csv", "json", "parquet")
_NUMBER = re.compile(r"^(-|-?\d+(\.\d+)?)$")


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


def _start(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date and time") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _session(args: argparse.Namespace) -> SparkSession:
    from sqlqueue_orm.contrib import spark

    spark.require_pyspark()
    # Progress of long jobs is logged at INFO: shown by default, with the queue in each line.
    progress_log = logging.getLogger("sqlqueue_orm.contrib.spark")
    if progress_log.getEffectiveLevel() > logging.INFO:
        progress_log.setLevel(logging.INFO)
    session = spark.spark_session(args.master)
    session.sparkContext.setLogLevel("ERROR")
    return session


def _url(args: argparse.Namespace) -> str:
    return arguments.resolve_url(args)


def _input_format(path: str, fmt: str | None) -> str:
    chosen = fmt or os.path.splitext(path.rstrip("/"))[1].lstrip(".").lower()
    if chosen == "jsonl":
        chosen = "json"
    if chosen not in _FORMATS:
        raise exceptions.ConfigurationError(
            f"cannot tell the format of input {path!r}; pass --format {'|'.join(_FORMATS)}"
        )
    return chosen


def _input_columns(path: str, fmt: str) -> list[str] | None:
    """The columns of a local CSV or Parquet file, read without Spark (None: not known here)."""
    if not checks.is_local(path) or not os.path.isfile(checks.local_path(path)):
        return None
    local = checks.local_path(path)
    try:
        if fmt == "csv":
            with open(local, newline="", encoding="utf-8") as stream:
                return next(csv.reader(stream), [])
        if fmt == "parquet":
            from pyarrow import parquet

            return list(parquet.read_schema(local).names)
    except (OSError, UnicodeDecodeError, ImportError, ValueError):
        return None
    return None  # JSON: Spark infers columns from every record


def _check_send(args: argparse.Namespace) -> None:
    """Everything ``spark send`` can check before Spark starts (see :mod:`.checks`)."""
    fmt = _input_format(args.input, args.format)
    checks.check_readable("input", args.input)
    columns = _input_columns(args.input, fmt)
    if columns is not None:
        wanted = [("body column", args.body_column), ("key column", args.key_column)]
        wanted += [(f"header {name!r} column", column) for name, column in args.header_column or []]
        for what, column in wanted:
            if column is not None and column not in columns:
                raise exceptions.ConfigurationError(
                    f"{what} {column!r} is not in input {args.input!r}; its columns are {columns}"
                )
    address = checks.check_database(_url(args), args.queue)
    if args.key_column is not None and address is not None:
        from sqlqueue_orm.contrib.spark import models

        if len(str(address)) > models.MAX_DESTINATION_LENGTH:
            raise exceptions.ConfigurationError(
                f"queue {str(address)!r} is longer than {models.MAX_DESTINATION_LENGTH} "
                "characters, the most the send ledger records; send without --key-column"
            )


def _check_ingest(args: argparse.Namespace) -> None:
    """Everything ``spark ingest`` can check before Spark starts."""
    url = _url(args)
    checks.check_ingest_arguments(url, args.queue, args.batch, args.partitions, args.max_batches)
    checks.check_writable_directory("dataset path", args.path)
    checks.check_database(url, args.queue)


def _check_report(args: argparse.Namespace) -> None:
    """Everything ``spark report`` can check before Spark starts."""
    for path in args.path:
        checks.check_dataset(path)
    if args.chart:
        if not args.chart.lower().endswith(".png"):
            raise exceptions.ConfigurationError(f"chart {args.chart!r} must be a .png file")
        checks.check_existing_directory(
            "chart directory", os.path.dirname(os.path.abspath(args.chart))
        )


def _read_input(session: SparkSession, path: str, fmt: str | None) -> DataFrame:
    chosen = _input_format(path, fmt)
    reader = session.read
    if chosen == "csv":
        return reader.option("header", True).option("inferSchema", True).csv(path)
    if chosen == "json":
        return reader.json(path)
    return reader.parquet(path)


def _cmd_send(args: argparse.Namespace) -> int:
    _check_send(args)
    from sqlqueue_orm.contrib.spark import sending

    session = _session(args)
    frame = _read_input(session, args.input, args.format)
    if args.partitions:
        frame = frame.repartition(args.partitions)
    result = sending.send_dataframe(
        frame,
        args.queue,
        _url(args),
        body_column=args.body_column,
        key_column=args.key_column,
        headers=dict(args.header or []),
        header_columns=dict(args.header_column or []),
        batch_size=args.batch,
    )
    print(f"{result.destination}: sent {result.sent} message(s), "
          f"skipped {result.skipped} already sent")
    return 0


def _cmd_ingest(args: argparse.Namespace) -> int:
    _check_ingest(args)
    from sqlqueue_orm.contrib.spark import ingesting

    session = _session(args)
    stop = threading.Event()
    if args.follow:
        # SIGINT/SIGTERM end the stream after its current batch (what it committed is kept).
        def _stop(signum: int, _frame: object) -> None:
            log.info("queue %s: stopping on %s", args.queue, signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
    result = ingesting.ingest(
        session,
        _url(args),
        args.queue,
        args.path,
        batch_size=args.batch,
        partitions=args.partitions,
        max_batches=args.max_batches,
        include_body=not args.no_body,
        follow=args.follow,
        stop=stop,
        trigger_seconds=args.trigger,
    )
    if result.recovered:
        print(f"{result.queue}: finished {result.recovered} batch(es) "
              f"({result.recovered_messages} message(s)) of an interrupted run")
    print(f"{result.queue}: ingested {result.messages} message(s) in {result.batches} "
          f"batch(es) into {result.path}")
    return 0


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Format *rows* as a plain text table; numbers right-aligned."""
    cells = [[str(column) for column in columns]] + [
        ["-" if value is None else str(value) for value in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    numeric = [
        bool(rows) and all(_NUMBER.match(row[i]) for row in cells[1:])
        for i in range(len(columns))
    ]
    lines = []
    for index, row in enumerate(cells):
        parts = [
            cell.rjust(width) if numeric[i] and index else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _cmd_report(args: argparse.Namespace) -> int:
    _check_report(args)
    from sqlqueue_orm.contrib.spark import reporting

    session = _session(args)
    result = reporting.report(session, args.path, bucket_seconds=args.bucket, exact=args.exact)
    summary = result.summary.collect()  # one row per message type and endpoint
    failures = result.failures.collect()  # one row per exception type
    processed = sum(int(row["processed"]) for row in summary)
    failed = sum(int(row["failed"]) for row in summary)
    print(f"{result.messages} message(s): {processed} processed, {failed} failed "
          f"({'exact' if args.exact else 'approximate'} percentiles)\n")
    print(table(
        ["message type", "endpoint", "processed", "failed", "msg/s",
         "proc p50 ms", "p95", "p99", "crit p50 ms", "p95", "p99"],
        [
            [row["message_type"], row["processing_endpoint"], int(row["processed"]),
             int(row["failed"]), f"{float(row['per_second']):.3f}",
             _ms(row["processing_p50_ms"]), _ms(row["processing_p95_ms"]),
             _ms(row["processing_p99_ms"]), _ms(row["critical_p50_ms"]),
             _ms(row["critical_p95_ms"]), _ms(row["critical_p99_ms"])]
            for row in summary
        ],
    ))
    if failures:
        print()
        print(table(
            ["exception type", "failures", "message types"],
            [[row["exception_type"], int(row["failures"]), ", ".join(row["message_types"])]
             for row in failures],
        ))
    if args.chart:
        from sqlqueue_orm.contrib.spark import chart

        overall = [row.asDict() for row in result.throughput.collect()]  # one row per bucket
        by_endpoint = [row.asDict() for row in result.throughput_by_endpoint.collect()]
        chart.render_chart(overall, by_endpoint, result.bucket_seconds, args.chart)
        print(f"\nchart: {args.chart} ({len(overall)} buckets of {result.bucket_seconds} s)")
    return 0


def _cmd_sample(args: argparse.Namespace) -> int:
    from sqlqueue_orm.contrib.spark import sample

    url = _url(args)
    checks.check_database(url)
    from sqlqueue_orm.transport import Transport

    with Transport(url) as transport:
        audit, error = sample.fill_sample_queues(
            transport,
            audit_queue=args.audit_queue,
            error_queue=args.error_queue,
            count=args.count,
            failure_rate=args.failure_rate,
            start=args.start,
            span=dt.timedelta(minutes=args.minutes),
            seed=args.seed,
        )
    print(f"{args.audit_queue}: {len(audit)} audit message(s); "
          f"{args.error_queue}: {len(error)} error message(s)")
    return 0


def register(subparsers: Any) -> None:
    """Add ``spark send|ingest|report|sample`` to the ``sqlqueue`` command line."""
    spark = subparsers.add_parser(
        "spark", help="Spark pipelines: send DataFrame rows, ingest audit/error queues, report"
    )
    commands = spark.add_subparsers(dest="spark_command", required=True, metavar="COMMAND")

    def with_master(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--master", default="local[*]",
                            help="Spark master URL (default: local[*])")

    sub = commands.add_parser("send", help="send one message per row of a CSV/JSON/Parquet input")
    sub.add_argument("--queue", required=True, help="destination queue")
    sub.add_argument("--input", required=True, help="input file or directory")
    sub.add_argument("--format", choices=_FORMATS, help="input format (default: from extension)")
    sub.add_argument("--body-column", help="body column (default: the whole row as JSON)")
    sub.add_argument("--key-column",
                     help="row key: deterministic message ids, re-runs skip what was sent")
    sub.add_argument("--header", action="append", type=arguments.key_value, metavar="NAME=VALUE",
                     help="constant header (repeatable)")
    sub.add_argument("--header-column", action="append", type=arguments.key_value,
                     metavar="NAME=COLUMN",
                     help="header from a column (repeatable)")
    sub.add_argument("--batch", type=arguments.positive_int, default=1_000, metavar="N",
                     help="messages per transaction (default 1000)")
    sub.add_argument("--partitions", type=arguments.positive_int, metavar="N",
                     help="repartition the input first (parallel connections)")
    with_master(sub)
    sub.set_defaults(func=_cmd_send)

    sub = commands.add_parser("ingest", help="drain a queue into a Parquet dataset, exactly once")
    sub.add_argument("--queue", required=True, help="queue to drain (audit, error)")
    sub.add_argument("--path", required=True, help="dataset directory (any Hadoop path)")
    sub.add_argument("--batch", type=arguments.bounded_int(1, checks.MAX_INGEST_BATCH_SIZE),
                     default=10_000, metavar="N",
                     help="messages per batch (default 10000)")
    sub.add_argument("--partitions", type=arguments.positive_int, metavar="N",
                     help="Spark tasks per batch (default: default parallelism)")
    sub.add_argument("--max-batches", type=arguments.positive_int, metavar="N")
    sub.add_argument("--no-body", action="store_true", help="do not store message bodies")
    sub.add_argument("--follow", action="store_true",
                     help="keep streaming new messages until SIGINT/SIGTERM, showing progress")
    sub.add_argument("--trigger", type=arguments.positive_seconds, default=1.0, metavar="SECONDS",
                     help="with --follow: seconds between micro-batches (default 1)")
    with_master(sub)
    sub.set_defaults(func=_cmd_ingest)

    sub = commands.add_parser("report", help="throughput, latency and failures of a dataset")
    sub.add_argument("--path", required=True, action="append",
                     help="dataset directory (repeatable)")
    sub.add_argument("--chart", metavar="FILE.png", help="write a PNG chart")
    sub.add_argument("--bucket", type=arguments.positive_int, metavar="SECONDS",
                     help="throughput bucket (default: ~120 buckets over the data)")
    sub.add_argument("--exact", action="store_true",
                     help="exact percentiles (default: approximate, for large data)")
    with_master(sub)
    sub.set_defaults(func=_cmd_report)

    sub = commands.add_parser("sample",
                              help="fill audit/error queues with synthetic NServiceBus messages")
    sub.add_argument("--audit-queue", default="audit")
    sub.add_argument("--error-queue", default="error")
    sub.add_argument("--count", type=arguments.positive_int, default=10_000, metavar="N",
                     help="audit messages (default 10000)")
    sub.add_argument("--failure-rate", type=_rate, default=0.02, metavar="F",
                     help="error messages per audit message (default 0.02)")
    sub.add_argument("--minutes", type=arguments.positive_int, default=60,
                     help="time window of the messages (default 60)")
    sub.add_argument("--start", type=_start, help="window start, ISO (default: --minutes ago)")
    sub.add_argument("--seed", type=int, default=1)
    sub.set_defaults(func=_cmd_sample)
