"""DDL extensions SQLAlchemy lacks, in one place.

* ``mssql_with={"OPTIMIZE_FOR_SEQUENTIAL_KEY": "ON", "ONLINE": "ON"}`` on an :class:`Index`
  renders ``WITH (...)`` after ``CREATE INDEX`` on SQL Server. ``OPTIMIZE_FOR_SEQUENTIAL_KEY`` is
  left out when the server is known to be older than SQL Server 2019 (major version 15).
* :class:`BodyAsText`: the expression of the optional ``BodyString`` computed column per dialect.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Index
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler, SQLCompiler
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.types import UnicodeText

from sqlqueue_orm import dialects

Index.argument_for("mssql", "with", None)

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


class BodyAsText(ColumnElement[str]):
    """``Body`` as text, for the optional ``BodyString`` computed column.

    SQL Server casts to nvarchar(max) exactly as NServiceBus does (UTF-8 bodies come out garbled
    there, as in NServiceBus, PR #453); PostgreSQL uses ``encode(Body, 'escape')``, which never
    fails on bytes that are not UTF-8 (a generated column that fails would block the send);
    SQLite casts.
    """

    type = UnicodeText()
    inherit_cache = True


@compiles(BodyAsText)
def _body_as_text_default(element: BodyAsText, compiler: SQLCompiler, **kw: Any) -> str:
    return 'CAST("Body" AS TEXT)'


@compiles(BodyAsText, "mssql")
def _body_as_text_mssql(element: BodyAsText, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST([Body] AS NVARCHAR(max))"


@compiles(BodyAsText, "postgresql")
def _body_as_text_postgresql(element: BodyAsText, compiler: SQLCompiler, **kw: Any) -> str:
    # NServiceBus's PostgreSQL layout: the body column is unquoted ``body``.
    return "encode(body, 'escape')"
