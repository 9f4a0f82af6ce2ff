"""Spark data pipelines: send a message per DataFrame row, ingest audit/error queues, report.

Needs the ``spark`` extra (``pip install sqlqueue_orm[spark]``). Importing this package does not
import PySpark: each name below loads :mod:`sqlqueue_orm.contrib.spark.pipeline` on first use,
and :func:`require_pyspark` turns a missing PySpark into a :class:`ConfigurationError` that says
what to install. :mod:`~sqlqueue_orm.contrib.spark.sample` (synthetic NServiceBus audit and error
messages for demos) needs no Spark at all.

Each Spark task opens its own connection from the database URL with the Python drivers
(sqlite3, psycopg, pyodbc), so no JDBC jar is needed and nothing runs on driver-local state.
See ``docs/spark.md`` for the guarantees.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    from sqlqueue_orm.contrib.spark.pipeline import (
        DATASET_SCHEMA,
        QUEUE_ROW_SCHEMA,
        IngestInProgress,
        IngestResult,
        Report,
        SendResult,
        failures,
        ingest,
        parse_messages,
        report,
        send_dataframe,
        spark_session,
        summary,
        throughput,
    )

__all__ = [
    "DATASET_SCHEMA",
    "QUEUE_ROW_SCHEMA",
    "IngestInProgress",
    "IngestResult",
    "Report",
    "SendResult",
    "failures",
    "ingest",
    "parse_messages",
    "report",
    "require_pyspark",
    "send_dataframe",
    "spark_session",
    "summary",
    "throughput",
]

_PIPELINE = "sqlqueue_orm.contrib.spark.pipeline"


def require_pyspark() -> None:
    """Import PySpark, or raise :class:`ConfigurationError` saying how to install it."""
    try:
        importlib.import_module("pyspark.sql")
    except ImportError as error:
        raise exceptions.ConfigurationError(
            f"the Spark pipeline needs PySpark ({error}); install sqlqueue_orm[spark]"
        ) from error


def __getattr__(name: str) -> Any:
    """Load the pipeline (and PySpark) only when one of its names is used."""
    if name in __all__ and name != "require_pyspark":
        require_pyspark()
        module = importlib.import_module(_PIPELINE)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
