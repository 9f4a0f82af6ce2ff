"""DDL extensions SQLAlchemy lacks, in one place.

* ``mssql_with={"OPTIMIZE_FOR_SEQUENTIAL_KEY": "ON", "ONLINE": "ON"}`` on an :class:`Index`
  (built with :func:`sql_server_index`) renders ``WITH (...)`` after ``CREATE INDEX`` on SQL
  Server. ``OPTIMIZE_FOR_SEQUENTIAL_KEY`` is left out when the server is known to be older than
  SQL Server 2019 (major version 15).

The optional ``BodyString`` column's DDL is each dialect's ``body_string_ddl``
(:mod:`sqlqueue_orm.dialects`).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Index
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler

from sqlqueue_orm import dialects

#: SQL Server 2019 is major version 15: the first with OPTIMIZE_FOR_SEQUENTIAL_KEY.
SQL_SERVER_2019 = 15


def mssql_index_options(options: dict[str, str], server_version: tuple[int, ...] | None) -> str:
    """Render ``WITH (...)`` for *options*, dropping those the server version does not know."""
    kept = {
        key: value
        for key, value in options.items()
        if not (
            key == "OPTIMIZE_FOR_SEQUENTIAL_KEY"
            and server_version
            and server_version[0] < SQL_SERVER_2019
        )
    }
    if not kept:
        return ""
    return " WITH (" + ", ".join(f"{key} = {value}" for key, value in kept.items()) + ")"


@functools.cache
def _accept_mssql_with() -> None:
    Index.argument_for("mssql", "with", None)


def sql_server_index(name: str, *columns: Any, **options: Any) -> Index:
    """An index with SQL Server *options* (``mssql_clustered=...``, ``mssql_with=...``).

    ``mssql_with`` is made known to SQLAlchemy here, on first use, not on import: that imports
    SQLAlchemy's SQL Server dialect, which a process on another database never needs.
    """
    _accept_mssql_with()
    return Index(name, *columns, **options)


def compile_ddl(element: ExecutableDDLElement, dialect: Dialect) -> str:
    """*element* compiled for *dialect*, without surrounding whitespace (DDL a DBA would run)."""
    return str(element.compile(dialect=dialect)).strip()


@compiles(CreateIndex, "mssql")
def _create_index_mssql(create: CreateIndex, compiler: DDLCompiler, **kw: Any) -> str:
    text: str = compiler.visit_create_index(create, **kw)  # type: ignore[no-untyped-call]
    options = dialects.for_dialect(compiler.dialect).options_of(create.element).get("with")
    if options:
        version = tuple(
            int(part)
            for part in compiler.dialect.server_version_info or ()
            if isinstance(part, int)
        )
        text += mssql_index_options(dict(options), version or None)
    return text
