"""Queue tables as each era of NServiceBus.SqlServer left them, one function per era per dialect.

SQL Server DDL is NServiceBus's own (reference section 1 and the 1.x design page); PostgreSQL and
SQLite get the same shapes with the nearest types:

* v1: SQL Server varchar(max) Headers, CLUSTERED Index_RowVersion, no Expires index;
  PostgreSQL varchar Headers, bigserial RowVersion with a b-tree index; SQLite VARCHAR Headers,
  RowVersion INTEGER PRIMARY KEY without AUTOINCREMENT.
* 2.2.2: plus Index_Expires (Expires) INCLUDE (Id, RowVersion), not filtered (SQLite: no INCLUDE).
* 3.1: nvarchar(max) / text / TEXT Headers, Index_Expires filtered WHERE Expires IS NOT NULL.
* heap: Index_RowVersion NONCLUSTERED (a heap); PostgreSQL an identity column; SQLite
  AUTOINCREMENT plus a (redundant) index on RowVersion.
* renamed: 3.1 with both indexes named otherwise.
* no-indexes: heap without any index.
* no-recoverable: heap without the Recoverable column (NServiceBus 7+ tolerates that).

Every name goes through SQLAlchemy's identifier quoting, so awkward names (hyphen, space, dot,
quotes) and a schema other than the default (an ATTACHed database on SQLite) work.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import uuid
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import quoted_name

from sqlqueue_orm import headers
from sqlqueue_orm.models.queue_table import index_name

ERAS = ("v1", "2.2.2", "3.1", "heap", "renamed", "no-indexes", "no-recoverable")


@dataclasses.dataclass(frozen=True)
class Names:
    """Quoted names of one legacy table on one dialect."""

    dialect: Dialect
    table: str
    schema: str | None

    def quote(self, name: str) -> str:
        return str(self.dialect.identifier_preparer.quote_identifier(name))

    @property
    def qualified(self) -> str:
        name = self.quote(self.table)
        return name if self.schema is None else f"{self.quote(self.schema)}.{name}"

    def index(self, base: str) -> str:
        """The current name of index *base* on this dialect, quoted."""
        return self.quote(index_name(self.table, base, self.dialect.name))

    def other(self, base: str) -> str:
        """A name the current code does not use ("an index named differently")."""
        return self.quote(f"ix {self.table} {base.removeprefix('Index_').lower()}")

    def sqlite_index(self, quoted_index: str) -> str:
        """``CREATE INDEX`` target on SQLite: the schema goes on the index name."""
        return quoted_index if self.schema is None else f"{self.quote(self.schema)}.{quoted_index}"

    @property
    def sqlite_table(self) -> str:
        """``ON`` target on SQLite: the bare table name."""
        return self.quote(self.table)


# -- SQL Server: NServiceBus's own DDL ------------------------------------------------------------
def _mssql_table(n: Names, headers_type: str, recoverable: bool = True) -> str:
    return (
        f"CREATE TABLE {n.qualified} ("
        "[Id] uniqueidentifier NOT NULL, [CorrelationId] varchar(255), "
        "[ReplyToAddress] varchar(255), "
        + ("[Recoverable] bit NOT NULL, " if recoverable else "")
        + f"[Expires] datetime, [Headers] {headers_type} NOT NULL, [Body] varbinary(max), "
        "[RowVersion] bigint IDENTITY(1,1) NOT NULL) ON [PRIMARY]"
    )


def v1_mssql(n: Names) -> list[str]:
    return [
        _mssql_table(n, "varchar(max)"),
        f"CREATE CLUSTERED INDEX [Index_RowVersion] ON {n.qualified} ([RowVersion] ASC)",
    ]


def era_2_2_2_mssql(n: Names) -> list[str]:
    return [
        *v1_mssql(n),
        f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {n.qualified} ([Expires] ASC) "
        "INCLUDE ([Id], [RowVersion])",
    ]


def era_3_1_mssql(
    n: Names, expires: str = "[Index_Expires]", row_version: str = "[Index_RowVersion]"
) -> list[str]:
    return [
        _mssql_table(n, "nvarchar(max)"),
        f"CREATE CLUSTERED INDEX {row_version} ON {n.qualified} ([RowVersion] ASC)",
        f"CREATE NONCLUSTERED INDEX {expires} ON {n.qualified} ([Expires] ASC) "
        "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL",
    ]


def heap_mssql(n: Names, recoverable: bool = True, indexes: bool = True) -> list[str]:
    statements = [_mssql_table(n, "nvarchar(max)", recoverable)]
    if indexes:
        statements += [
            f"CREATE NONCLUSTERED INDEX [Index_RowVersion] ON {n.qualified} ([RowVersion] ASC)",
            f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {n.qualified} ([Expires] ASC) "
            "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL",
        ]
    return statements


def renamed_mssql(n: Names) -> list[str]:
    return era_3_1_mssql(n, n.other("Index_Expires"), n.other("Index_RowVersion"))


def no_indexes_mssql(n: Names) -> list[str]:
    return heap_mssql(n, indexes=False)


def no_recoverable_mssql(n: Names) -> list[str]:
    return heap_mssql(n, recoverable=False)


# -- PostgreSQL --------------------------------------------------------------------------------
def _pg_table(n: Names, headers_type: str, row_version: str, recoverable: bool = True) -> str:
    return (
        f"CREATE TABLE {n.qualified} ("
        '"Id" uuid NOT NULL, "CorrelationId" varchar(255), "ReplyToAddress" varchar(255), '
        + ('"Recoverable" boolean NOT NULL, ' if recoverable else "")
        + f'"Expires" timestamp, "Headers" {headers_type} NOT NULL, "Body" bytea, '
        f'"RowVersion" {row_version})'
    )


_SERIAL = "bigserial NOT NULL"
_IDENTITY = "bigint GENERATED BY DEFAULT AS IDENTITY NOT NULL"


def _pg_expires(n: Names, name: str, filtered: bool) -> str:
    where = ' WHERE "Expires" IS NOT NULL' if filtered else ""
    return f'CREATE INDEX {name} ON {n.qualified} ("Expires") INCLUDE ("Id", "RowVersion"){where}'


def _pg_row_version(n: Names, name: str) -> str:
    return f'CREATE INDEX {name} ON {n.qualified} ("RowVersion")'


def v1_postgresql(n: Names) -> list[str]:
    return [
        _pg_table(n, "varchar", _SERIAL),
        _pg_row_version(n, n.index("Index_RowVersion")),
    ]


def era_2_2_2_postgresql(n: Names) -> list[str]:
    return [*v1_postgresql(n), _pg_expires(n, n.index("Index_Expires"), filtered=False)]


def era_3_1_postgresql(n: Names, renamed: bool = False) -> list[str]:
    def name(base: str) -> str:
        return n.other(base) if renamed else n.index(base)

    return [
        _pg_table(n, "text", _SERIAL),
        _pg_row_version(n, name("Index_RowVersion")),
        _pg_expires(n, name("Index_Expires"), filtered=True),
    ]


def heap_postgresql(n: Names, recoverable: bool = True, indexes: bool = True) -> list[str]:
    statements = [_pg_table(n, "text", _IDENTITY, recoverable)]
    if indexes:
        statements += [
            _pg_row_version(n, n.index("Index_RowVersion")),
            _pg_expires(n, n.index("Index_Expires"), filtered=True),
        ]
    return statements


def renamed_postgresql(n: Names) -> list[str]:
    return era_3_1_postgresql(n, renamed=True)


def no_indexes_postgresql(n: Names) -> list[str]:
    return heap_postgresql(n, indexes=False)


def no_recoverable_postgresql(n: Names) -> list[str]:
    return heap_postgresql(n, recoverable=False)


# -- SQLite ---------------------------------------------------------------------------------------
def _sqlite_table(
    n: Names, headers_type: str, autoincrement: bool, recoverable: bool = True
) -> str:
    key = "PRIMARY KEY AUTOINCREMENT" if autoincrement else "PRIMARY KEY"
    return (
        f"CREATE TABLE {n.qualified} ("
        '"Id" CHAR(32) NOT NULL, "CorrelationId" VARCHAR(255), "ReplyToAddress" VARCHAR(255), '
        + ('"Recoverable" BOOLEAN NOT NULL, ' if recoverable else "")
        + f'"Expires" DATETIME, "Headers" {headers_type} NOT NULL, "Body" BLOB, '
        f'"RowVersion" INTEGER NOT NULL {key})'
    )


def _sqlite_expires(n: Names, name: str, filtered: bool) -> str:
    where = ' WHERE "Expires" IS NOT NULL' if filtered else ""
    return f'CREATE INDEX {n.sqlite_index(name)} ON {n.sqlite_table} ("Expires"){where}'


def _sqlite_row_version(n: Names, name: str) -> str:
    return f'CREATE INDEX {n.sqlite_index(name)} ON {n.sqlite_table} ("RowVersion")'


def v1_sqlite(n: Names) -> list[str]:
    return [_sqlite_table(n, "VARCHAR", autoincrement=False)]


def era_2_2_2_sqlite(n: Names) -> list[str]:
    return [*v1_sqlite(n), _sqlite_expires(n, n.index("Index_Expires"), filtered=False)]


def era_3_1_sqlite(n: Names) -> list[str]:
    return [
        _sqlite_table(n, "TEXT", autoincrement=False),
        _sqlite_expires(n, n.index("Index_Expires"), filtered=True),
    ]


def heap_sqlite(n: Names, recoverable: bool = True, indexes: bool = True) -> list[str]:
    statements = [_sqlite_table(n, "TEXT", autoincrement=True, recoverable=recoverable)]
    if indexes:
        statements += [
            _sqlite_row_version(n, n.index("Index_RowVersion")),
            _sqlite_expires(n, n.index("Index_Expires"), filtered=True),
        ]
    return statements


def renamed_sqlite(n: Names) -> list[str]:
    return [
        _sqlite_table(n, "TEXT", autoincrement=False),
        _sqlite_row_version(n, n.other("Index_RowVersion")),
        _sqlite_expires(n, n.other("Index_Expires"), filtered=True),
    ]


def no_indexes_sqlite(n: Names) -> list[str]:
    return heap_sqlite(n, indexes=False)


def no_recoverable_sqlite(n: Names) -> list[str]:
    return heap_sqlite(n, recoverable=False)


BUILDERS: dict[tuple[str, str], Callable[[Names], list[str]]] = {}
for _dialect in ("mssql", "postgresql", "sqlite"):
    for _era, _prefix in (
        ("v1", "v1"),
        ("2.2.2", "era_2_2_2"),
        ("3.1", "era_3_1"),
        ("heap", "heap"),
        ("renamed", "renamed"),
        ("no-indexes", "no_indexes"),
        ("no-recoverable", "no_recoverable"),
    ):
        BUILDERS[(_era, _dialect)] = globals()[f"{_prefix}_{_dialect}"]


def create(connection: Connection, era: str, table: str, schema: str | None) -> None:
    """Create the *era* queue table *table* in *schema* on *connection*."""
    names = Names(connection.dialect, table, schema)
    for statement in BUILDERS[(era, connection.dialect.name)](names):
        connection.exec_driver_sql(statement, execution_options={"no_parameters": True})


# -- messages ------------------------------------------------------------------------------------
NON_ASCII = ("Zürich ✓", "東京 🚀", "Ωμέγα — “quoted”", "naïve café")


def messages(count: int, seed: int, has_recoverable: bool = True) -> list[dict[str, object]]:
    """*count* messages: some with non-ASCII and ``\\/``-escaped headers, some with Expires."""
    rng = random.Random(seed)
    now = dt.datetime(2024, 5, 1, 12, 0, 0)
    rows = []
    for number in range(count):
        header_values = {
            headers.MESSAGE_ID: str(uuid.UUID(int=rng.getrandbits(128))),
            "NServiceBus.ReplyToAddress": f"orders@[dbo]@[catalog/{number}]",
            "NServiceBus.EnclosedMessageTypes": "Shop.Orders.PlaceOrder, Shop/Orders",
        }
        if number % 10 == 3:
            header_values["Note"] = NON_ASCII[number % len(NON_ASCII)]
        expires = None
        if number % 3 == 0:
            expires = now + dt.timedelta(minutes=rng.randint(-600, 600), microseconds=0)
        row: dict[str, object] = {
            "Id": uuid.UUID(int=rng.getrandbits(128)),
            "CorrelationId": None if number % 4 else f"corr-{number}",
            "ReplyToAddress": None,
            "Expires": expires,
            "Headers": headers.serialize(header_values),
            "Body": None if number % 50 == 7 else rng.randbytes(rng.randint(0, 300)),
        }
        if has_recoverable:
            row["Recoverable"] = True
        rows.append(row)
    return rows


def insert(
    connection: Connection, table: str, schema: str | None, rows: list[dict[str, object]]
) -> None:
    """Insert *rows* in one executemany (RowVersion from the table's identity)."""
    types = {
        "Id": sa.Uuid(),
        "CorrelationId": sa.String(),
        "ReplyToAddress": sa.String(),
        "Recoverable": sa.Boolean(),
        "Expires": sa.DateTime(),
        "Headers": sa.UnicodeText(),
        "Body": sa.LargeBinary(),
    }
    columns = [sa.column(name, types[name]) for name in rows[0]]
    target = sa.table(
        quoted_name(table, True),
        *columns,
        schema=None if schema is None else quoted_name(schema, True),
    )
    connection.execute(sa.insert(target), rows)


def column_list(
    connection: Connection, table: str, schema: str | None, has_recoverable: bool = True
) -> str:
    names = Names(connection.dialect, table, schema)
    columns = ["Id", "CorrelationId", "ReplyToAddress", "Expires", "Headers", "Body", "RowVersion"]
    if has_recoverable:
        columns.insert(3, "Recoverable")
    present = _columns(connection, names)
    if "seq" in present:  # NServiceBus's PostgreSQL layout (revision 0008): the same values
        renamed = {name: name.lower() for name in columns} | {"RowVersion": "seq"}
        renamed["Recoverable"] = "true"  # dropped: it only ever held true
        return ", ".join(
            names.quote(renamed[column])
            if renamed[column] in present
            else ("true" if column == "Recoverable" else "NULL")
            for column in columns
        )
    return ", ".join(names.quote(column) for column in columns)


def _columns(connection: Connection, names: Names) -> set[str]:
    if connection.dialect.name != "postgresql":
        return set()
    return {
        str(row[0])
        for row in connection.execute(
            sa.text(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:r) "
                "AND attnum > 0 AND NOT attisdropped"
            ),
            {"r": names.qualified},
        )
    }


def snapshot(
    connection: Connection, table: str, schema: str | None, has_recoverable: bool = True
) -> list[tuple[object, ...]]:
    """Every row as the driver returns it, in RowVersion (FIFO) order (either PG layout)."""
    names = Names(connection.dialect, table, schema)
    order = "seq" if "seq" in _columns(connection, names) else "RowVersion"
    return [
        tuple(row)
        for row in connection.exec_driver_sql(
            f"SELECT {column_list(connection, table, schema, has_recoverable)} "
            f"FROM {names.qualified} ORDER BY {names.quote(order)}",
            execution_options={"no_parameters": True},
        )
    ]
