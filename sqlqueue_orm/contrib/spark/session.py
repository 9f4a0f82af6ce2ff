"""The Spark session, and what every Spark task needs: its own engine, its rows in chunks.

Each Spark task opens its own connection from the database URL with the project's drivers
(sqlite3, psycopg, pyodbc, through :func:`sqlqueue_orm.db.create_engine`), so no JDBC jar is
needed and the same code runs on ``local[*]`` and on a cluster whose executors have
``sqlqueue_orm`` and the driver installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import db

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Parameters per IN list (SQL Server takes at most 2100 in a statement).
IN_CHUNK = 1_000


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


def task_engine(url: str) -> sa.Engine:
    """An engine for one Spark task: no pool to outlive the task."""
    return db.create_engine(url, poolclass=sa.pool.NullPool)


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """*items* in lists of at most *size*."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
