"""Spark data pipelines: send a message per DataFrame row, ingest audit/error queues, report.

Needs the ``spark`` extra (``pip install sqlqueue_orm[spark]``). Importing this package does not
import PySpark: each name below loads its module on first use, and :func:`require_pyspark` turns
a missing PySpark into a :class:`ConfigurationError` that says what to install.

The modules, by concern: ``session`` (the SparkSession, task engines), ``sending``
(:func:`send_dataframe`), ``ingesting`` (:func:`ingest`: its file commit protocol), ``locking``
(one reader per queue), ``dataset`` (the ingested dataset's schema and parsing), ``reporting``
(:func:`report`), ``streaming`` (the ``sqlqueue`` data source: queues as streaming sources and
sinks, :func:`register`), ``options`` (the data source's options, read and checked), ``fences``
(the stream's end offsets), ``progress`` (progress lines of long jobs), ``models`` (the
``SparkSendLedger`` table) and ``checks`` (inputs checked before Spark starts). ``models``,
``checks``, ``locking``, ``fences`` and ``sample`` (synthetic NServiceBus audit and error
messages for demos) need no Spark at all.

Each Spark task opens its own connection from the database URL with the Python drivers
(sqlite3, psycopg, pyodbc), so no JDBC jar is needed and nothing runs on driver-local state.
See ``docs/spark.md`` for the guarantees.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    from sqlqueue_orm.contrib.spark.dataset import DATASET_SCHEMA, QUEUE_ROW_SCHEMA, parse_messages
    from sqlqueue_orm.contrib.spark.ingesting import IngestInProgress, IngestResult, ingest
    from sqlqueue_orm.contrib.spark.reporting import Report, failures, report, summary, throughput
    from sqlqueue_orm.contrib.spark.sending import SendResult, send_dataframe
    from sqlqueue_orm.contrib.spark.session import spark_session
    from sqlqueue_orm.contrib.spark.streaming import QueueDataSource, register

__all__ = [
    "DATASET_SCHEMA",
    "QUEUE_ROW_SCHEMA",
    "IngestInProgress",
    "IngestResult",
    "QueueDataSource",
    "Report",
    "SendResult",
    "failures",
    "ingest",
    "parse_messages",
    "register",
    "report",
    "require_pyspark",
    "send_dataframe",
    "spark_session",
    "summary",
    "throughput",
]

#: The module of each lazily loaded name.
_MODULES = {
    "DATASET_SCHEMA": "dataset",
    "QUEUE_ROW_SCHEMA": "dataset",
    "parse_messages": "dataset",
    "IngestInProgress": "ingesting",
    "IngestResult": "ingesting",
    "ingest": "ingesting",
    "Report": "reporting",
    "failures": "reporting",
    "report": "reporting",
    "summary": "reporting",
    "throughput": "reporting",
    "SendResult": "sending",
    "send_dataframe": "sending",
    "spark_session": "session",
    "QueueDataSource": "streaming",
    "register": "streaming",
}


def require_pyspark() -> None:
    """Import PySpark, or raise :class:`ConfigurationError` saying how to install it."""
    try:
        importlib.import_module("pyspark.sql")
    except ImportError as error:
        raise exceptions.ConfigurationError(
            f"the Spark pipeline needs PySpark ({error}); install sqlqueue_orm[spark]"
        ) from error


def __getattr__(name: str) -> Any:
    """Load a pipeline module (and PySpark) only when one of its names is used."""
    if name in _MODULES:
        require_pyspark()
        module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
