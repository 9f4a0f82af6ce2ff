"""Every statement of the hot path (send, receive, peek, purge), one frozen set per dialect.

Like NServiceBus's ``ISqlConstants``: one :class:`SqlText` per dialect, looked up by
``dialect.name``. Templates use ``{table}`` for the queue table and ``:name`` for parameters.
:func:`render` substitutes the table name *as SQLAlchemy's identifier preparer quotes it* (which
also doubles ``%`` for pyformat drivers) and turns the parameters into the driver's paramstyle,
so statements run through ``exec_driver_sql`` with no per-call compilation. No queue name ever
reaches SQL any other way.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import quoted_name

from sqlqueue_orm import addressing, exceptions


@dataclasses.dataclass(frozen=True)
class SqlText:
    """The statements of one dialect. ``None`` means the dialect does not need that variant."""

    send: str
    send_without_recoverable: str
    receive: str
    peek: str
    purge_expired: str
    purge_all: str
    #: Receive and purge for a role without UPDATE privilege (PostgreSQL): skips rows other
    #: receivers hold with transaction-scoped advisory locks instead of FOR UPDATE SKIP LOCKED.
    receive_without_row_locks: str | None = None
    purge_expired_without_row_locks: str | None = None
    #: Columns the statements need; a table without them is reported as outdated, not retried.
    required_columns: tuple[str, ...] = ()
    #: Whether send skips a row whose id is already queued (its row count then says so).
    send_skips_duplicates: bool = False
    #: How native ids go to and come back from the driver.
    id_to_driver: Callable[[uuid.UUID], Any] = str
    #: How the receive's Headers column is encoded when it comes back as bytes.
    headers_encoding: str = "utf-8"
    #: How a plain SELECT reads the Headers column (``{headers}``: its quoted name) so that
    #: the driver cannot fail decoding it, as the receive reads it.
    headers_read: str = "{headers}"
    #: How one statement of the transport's own runs without BEGIN/COMMIT around it (see
    #: :class:`sqlqueue_orm.connections.OwnStatement`): ``"driver"`` sets the DBAPI
    #: connection's ``autocommit`` flag (psycopg, pyodbc); ``"implicit"``: the driver already
    #: commits each statement by itself (sqlite3 with ``isolation_level=None``).
    autocommit: str = "driver"
    # Max rows one receive may ask for (SQL Server: TOP takes a bigint; keep batches sane).
    max_batch: int = 10_000
    #: Take one row by its native id (``:id``) as the receive takes rows, same columns out:
    #: locked with the receive's hints and skipped if another transaction holds it, so two
    #: operators retrying or deleting one error-queue message cannot both take it.
    receive_by_id: str = ""
    #: The receive, its advisory-lock variant and the peek scanning the queue from a lower
    #: bound of the row version (``:floor``, 0 for the whole queue), so that the dead index
    #: entries a long-held snapshot keeps below the head are skipped
    #: (:mod:`sqlqueue_orm.queuing.floor`). None: the dialect has no such dead prefix.
    receive_from_floor: str | None = None
    receive_without_row_locks_from_floor: str | None = None
    peek_from_floor: str | None = None


# Explicit CASTs: the driver may bind NULL without a type, and SQL Server cannot deduce one there.
_MSSQL_EXPIRES = (
    "CASE WHEN CAST(:ttbr AS bigint) IS NULL THEN NULL "
    "ELSE DATEADD(ms, CAST(:ttbr AS bigint) % 86400000, "
    "DATEADD(day, CAST(:ttbr AS bigint) / 86400000, GETUTCDATE())) END"
)

MSSQL: Final = SqlText(
    # TTBR is split into days and milliseconds: DATEADD(ms, ...) alone overflows past 24.8 days.
    send=(
        "INSERT INTO {table} ([Id], [Recoverable], [Expires], [Headers], [Body]) "
        f"VALUES (:id, 1, {_MSSQL_EXPIRES}, :headers, :body)"
    ),
    send_without_recoverable=(
        "INSERT INTO {table} ([Id], [Expires], [Headers], [Body]) "
        f"VALUES (:id, {_MSSQL_EXPIRES}, :headers, :body)"
    ),
    # Headers come back as their UTF-16LE bytes, decoded in Python (headers_encoding): nvarchar
    # holds any UTF-16 code units, an unpaired surrogate too, and pyodbc's strict decoding would
    # fail the whole fetch on one, blocking the queue behind that row. (NServiceBus reads
    # deleted.Headers as it is; .NET strings take unpaired surrogates.) The inner CAST reads a
    # legacy varchar column as Unicode first.
    receive=(
        "WITH message AS (SELECT TOP(:n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "ORDER BY [RowVersion]) "
        "DELETE FROM message "
        "OUTPUT deleted.[Id], deleted.[RowVersion], "
        "CASE WHEN deleted.[Expires] IS NULL THEN 0 "
        "WHEN deleted.[Expires] > GETUTCDATE() THEN 0 ELSE 1 END, "
        "CAST(CAST(deleted.[Headers] AS nvarchar(max)) AS varbinary(max)), deleted.[Body];"
    ),
    # READCOMMITTEDLOCK: READPAST needs locking reads, which RCSI (Azure SQL's default) turns off.
    peek=(
        "SELECT ISNULL(CAST(MAX([RowVersion]) - MIN([RowVersion]) + 1 AS bigint), 0) "
        "FROM {table} WITH (READPAST, READCOMMITTEDLOCK);"
    ),
    # Same lock order as receive (UPDLOCK, READPAST, ROWLOCK by RowVersion): no deadlock with it
    # (NServiceBus #308 came from the purge locking rows in another order).
    purge_expired=(
        "WITH message AS (SELECT TOP(:n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE [Expires] < GETUTCDATE() ORDER BY [RowVersion]) "
        "DELETE FROM message;"
    ),
    purge_all="DELETE FROM {table};",
    # Id has no index on SQL Server (nor in NServiceBus's layout): the error queue is small,
    # and READPAST skips a row another retry or delete holds instead of waiting for it.
    receive_by_id=(
        "WITH message AS (SELECT TOP(1) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE [Id] = :id) "
        "DELETE FROM message "
        "OUTPUT deleted.[Id], deleted.[RowVersion], "
        "CASE WHEN deleted.[Expires] IS NULL THEN 0 "
        "WHEN deleted.[Expires] > GETUTCDATE() THEN 0 ELSE 1 END, "
        "CAST(CAST(deleted.[Headers] AS nvarchar(max)) AS varbinary(max)), deleted.[Body];"
    ),
    id_to_driver=str,
    headers_encoding="utf-16-le",
    headers_read="CAST(CAST({headers} AS nvarchar(max)) AS varbinary(max))",
)

_PG_NOW = "timezone('UTC', clock_timestamp())"
# NServiceBus's PostgreSQL layout: unquoted lower-case columns id, expires, headers, body, seq
# (NServiceBus.Transport.PostgreSql PostgreSqlConstants, see models/queue_table.py).
# Headers are read as text: in a UTF8 database every text value is valid UTF-8 (the server
# refuses anything else on the way in), so psycopg cannot fail decoding one. A SQL_ASCII database
# would make psycopg return bytes, but SQLAlchemy's psycopg dialect cannot run on one at all.
_PG_RETURNING = (
    f"RETURNING id, seq, (expires IS NOT NULL AND expires <= {_PG_NOW}) AS expired, headers, body"
)
_PG_EXPIRES = (
    f"CASE WHEN CAST(:ttbr AS bigint) IS NULL THEN NULL "
    f"ELSE {_PG_NOW} + CAST(:ttbr AS bigint) * interval '1 millisecond' END"
)
# Advisory-lock claim: a bounded window of the oldest rows, keyed by (table oid, seq).
_PG_ADVISORY = (
    "SELECT c.seq FROM (SELECT seq, tableoid FROM {table} {where}"
    "ORDER BY seq LIMIT CAST(:window AS bigint)) AS c "
    "WHERE pg_try_advisory_xact_lock(CAST(c.tableoid AS integer), "
    "CAST(c.seq % 2147483648 AS integer)) LIMIT CAST(:n AS bigint)"
)
# The layout has no Recoverable column: both send variants are the .NET transport's column list.
# id is the primary key there: a message sent again while it is still queued (an outbox dispatch
# retried after a crash) is absorbed, not an error that would block the dispatch forever.
_PG_SEND = (
    "INSERT INTO {table} (id, expires, headers, body) "
    f"VALUES (:id, {_PG_EXPIRES}, :headers, :body) ON CONFLICT (id) DO NOTHING"
)

# The floor (queuing/floor.py): the index scan on seq starts at :floor instead of the first
# entry. Behind a long-held snapshot every received row leaves a dead index entry that vacuum
# may not remove, and an unbounded scan walks all of them before the first live row (268 ms a
# receive at 1,000,000). A bound parameter, not a literal: one prepared statement, one plan.
_PG_FLOOR = "seq >= CAST(:floor AS bigint)"

POSTGRESQL: Final = SqlText(
    send=_PG_SEND,
    send_without_recoverable=_PG_SEND,
    send_skips_duplicates=True,
    required_columns=("id", "expires", "headers", "body", "seq"),
    # = ANY(ARRAY(...)) runs the claim once, as an InitPlan, before the delete.
    receive=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        "SELECT seq FROM {table} ORDER BY seq LIMIT CAST(:n AS bigint) "
        f"FOR UPDATE SKIP LOCKED)) {_PG_RETURNING}"
    ),
    peek="SELECT COALESCE(MAX(seq) - MIN(seq) + 1, 0) FROM {table}",
    receive_from_floor=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        f"SELECT seq FROM {{table}} WHERE {_PG_FLOOR} ORDER BY seq LIMIT CAST(:n AS bigint) "
        f"FOR UPDATE SKIP LOCKED)) {_PG_RETURNING}"
    ),
    # MIN and MAX each become an index probe with the bound (the min/max optimisation keeps
    # the WHERE): MIN starts at the floor, MAX at the tail as before.
    peek_from_floor=f"SELECT COALESCE(MAX(seq) - MIN(seq) + 1, 0) FROM {{table}} WHERE {_PG_FLOOR}",
    purge_expired=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        f"SELECT seq FROM {{table}} WHERE expires < {_PG_NOW} "
        "ORDER BY seq LIMIT CAST(:n AS bigint) FOR UPDATE SKIP LOCKED))"
    ),
    purge_all="DELETE FROM {table}",
    # id is the primary key; SKIP LOCKED: a row another retry or delete holds is not taken.
    receive_by_id=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        "SELECT seq FROM {table} WHERE id = CAST(:id AS uuid) FOR UPDATE SKIP LOCKED)) "
        f"{_PG_RETURNING}"
    ),
    receive_without_row_locks=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        + _PG_ADVISORY.replace("{where}", "")
        + f")) {_PG_RETURNING}"
    ),
    receive_without_row_locks_from_floor=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        + _PG_ADVISORY.replace("{where}", f"WHERE {_PG_FLOOR} ")
        + f")) {_PG_RETURNING}"
    ),
    purge_expired_without_row_locks=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        + _PG_ADVISORY.replace("{where}", f"WHERE expires < {_PG_NOW} ")
        + "))"
    ),
    id_to_driver=lambda value: value,
)

# SQLite writes Expires as UTC text 'YYYY-MM-DD HH:MM:SS.SSS', which sorts as it compares.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_SQLITE_EXPIRES = (
    "CASE WHEN :ttbr IS NULL THEN NULL "
    "ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (:ttbr / 1000.0) || ' seconds') END"
)

SQLITE: Final = SqlText(
    headers_read="CAST({headers} AS BLOB)",
    send=(
        'INSERT INTO {table} ("Id", "Recoverable", "Expires", "Headers", "Body") '
        f"VALUES (:id, 1, {_SQLITE_EXPIRES}, :headers, :body)"
    ),
    send_without_recoverable=(
        'INSERT INTO {table} ("Id", "Expires", "Headers", "Body") '
        f"VALUES (:id, {_SQLITE_EXPIRES}, :headers, :body)"
    ),
    # SQLite serializes writers, so the oldest rows are never held by another receiver.
    # Headers come back as a BLOB and are decoded in Python: SQLite stores whatever bytes it is
    # given in a TEXT column, and the sqlite3 driver fails the whole fetch ("Could not decode to
    # UTF-8 column") on a value that is not UTF-8, which would block the queue behind that row.
    receive=(
        'DELETE FROM {table} WHERE "RowVersion" IN ('
        'SELECT "RowVersion" FROM {table} ORDER BY "RowVersion" LIMIT :n) '
        'RETURNING "Id", "RowVersion", '
        f'("Expires" IS NOT NULL AND "Expires" <= {_SQLITE_NOW}), '
        'CAST("Headers" AS BLOB), "Body"'
    ),
    # Two sub-selects: SQLite answers a lone MIN or MAX of the rowid from the b-tree's ends, but
    # scans the whole table for MAX(x) - MIN(x) in one select (3.8 s at 1,000,000 rows).
    peek=(
        'SELECT COALESCE((SELECT MAX("RowVersion") FROM {table}) '
        '- (SELECT MIN("RowVersion") FROM {table}) + 1, 0)'
    ),
    purge_expired=(
        'DELETE FROM {table} WHERE "RowVersion" IN ('
        f'SELECT "RowVersion" FROM {{table}} WHERE "Expires" < {_SQLITE_NOW} '
        'ORDER BY "RowVersion" LIMIT :n)'
    ),
    purge_all="DELETE FROM {table}",
    # One writer at a time: nobody else holds the row.
    receive_by_id=(
        'DELETE FROM {table} WHERE "Id" = :id '
        'RETURNING "Id", "RowVersion", '
        f'("Expires" IS NOT NULL AND "Expires" <= {_SQLITE_NOW}), '
        'CAST("Headers" AS BLOB), "Body"'
    ),
    id_to_driver=lambda value: value.hex,
    # One write statement takes the write lock as it starts, as BEGIN IMMEDIATE would.
    autocommit="implicit",
)

DIALECTS: Final[Mapping[str, SqlText]] = {
    "mssql": MSSQL,
    "postgresql": POSTGRESQL,
    "sqlite": SQLITE,
}


def for_dialect(dialect: Dialect) -> SqlText:
    """The statements of *dialect*, or :class:`ConfigurationError` naming an unsupported one."""
    try:
        return DIALECTS[dialect.name]
    except KeyError:
        raise exceptions.ConfigurationError(
            f"database dialect {dialect.name!r} is not supported; use one of {sorted(DIALECTS)}"
        ) from None


def format_table(dialect: Dialect, address: addressing.QueueAddress) -> str:
    """The queue table's name as *dialect* quotes it (catalog, schema and table)."""
    preparer = dialect.identifier_preparer
    parts = []
    if address.catalog is not None:
        parts.append(preparer.quote_identifier(address.catalog))
    if address.schema is not None:
        parts.append(preparer.quote_schema(quoted_name(address.schema, quote=True)))
    elif address.catalog is not None:
        parts.append("")  # [catalog]..[table]: the default schema of that catalog
    parts.append(preparer.quote_identifier(address.table))
    return ".".join(parts)


_PARAM = re.compile(r"(?<![:\w]):([a-z_]+)\b")


@dataclasses.dataclass(frozen=True)
class Statement:
    """One statement rendered for a driver: its text and how to lay out its parameters.

    Always execute it with :meth:`params` (even when it takes none): for pyformat drivers the
    text has every literal ``%`` doubled, which only parameter substitution turns back.
    """

    text: str
    names: tuple[str, ...]
    positional: bool
    #: Picks the positional values out of a mapping, in order (built once: C-level, no loop).
    _pick: Callable[[Mapping[str, Any]], Any] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.names:
            pick: Callable[[Mapping[str, Any]], Any] = lambda _values: ()  # noqa: E731
        elif len(self.names) == 1:
            name = self.names[0]
            pick = lambda values: (values[name],)  # noqa: E731
        else:
            pick = operator.itemgetter(*self.names)
        object.__setattr__(self, "_pick", pick)

    def params(self, values: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        """Parameters for ``exec_driver_sql``: a tuple (qmark) or a dict (pyformat/named)."""
        if self.positional:
            return self._pick(values)  # type: ignore[no-any-return]
        return values


def render(
    template: str, dialect: Dialect, table: str, literals: Mapping[str, int] | None = None
) -> Statement:
    """Render *template* for *dialect*'s driver, with the already-quoted *table* name.

    :param literals: parameters written into the text as integer literals instead of being
        bound (the receive's row limit: PostgreSQL then plans the statement once, generically,
        instead of a custom plan per call). Only ``int`` values are accepted, never text.
    """
    style = dialect.paramstyle
    names: list[str] = []
    written = dict(literals or {})
    for name, value in written.items():
        if type(value) is not int:
            raise TypeError(f"literal {name!r} must be an int, not {value!r}")

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in written:
            return str(written[name])
        names.append(name)
        if style == "qmark":
            return "?"
        if style == "format":
            return "%s"
        if style == "pyformat":
            return f"%({name})s"
        if style == "named":
            return f":{name}"
        if style == "numeric":
            return f":{len(names)}"
        raise exceptions.ConfigurationError(f"driver paramstyle {style!r} is not supported")

    text = _PARAM.sub(replace, template)
    if style in ("format", "pyformat"):
        # Literal % in the template (SQL Server's modulo) must reach these drivers doubled.
        text = text.replace("%", "%%").replace("%%s", "%s").replace("%%(", "%(")
    text = text.replace("{table}", table)
    positional = style in ("qmark", "format", "numeric")
    return Statement(text, tuple(names), positional)

