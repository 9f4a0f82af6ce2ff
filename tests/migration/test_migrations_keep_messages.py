"""`alembic upgrade head` on queue tables of every era, on real databases.

Each era's table (see legacy.py) holds 1,000 messages (non-ASCII and ``\\/``-escaped headers,
some with Expires, some rows deleted so RowVersion has gaps), lives in a schema other than the
default ("Legacy Queues": a schema on PostgreSQL, an ATTACHed database on SQLite) and has an
awkward name (hyphen, space, dot; one long non-ASCII name whose PostgreSQL index names need the
hash). After the upgrade every table must equal a freshly created current one by inspection,
and every message must still be there, byte for byte, coming out in its old FIFO order.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import Transport, cli, db, exceptions, headers
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.migration import environment, steps
from sqlqueue_orm.models.queue_table import build_queue_table
from tests.conftest import only
from tests.migration import shapes
from testsupport import legacy

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "Legacy Queues"
FRESH = "fresh current"
V1_REFERENCE = "v1 reference"
TABLES = {
    "v1": "v1-orders queue.v",
    "2.2.2": "2.2.2-billing queue.x",
    "3.1": "3.1-Ünïcödé-audit log." + "ø" * 15,  # 56 bytes: index names need the hash
    "heap": "heap-shipping queue.y",
    "renamed": "renamed-q.z w",
    "no-indexes": "no-indexes-q.z w",
    "no-recoverable": "no-recoverable-q.z w",
}
#: Eras whose SQL Server table is a heap (NServiceBus 4.3.2+): kept a heap by 0004.
HEAP_ERAS = ("heap", "no-indexes", "no-recoverable")
MESSAGES = 1000
NOT_A_QUEUE = "not a-queue.t"
OUTSIDE = "outside-v1 q.t"


def has_recoverable(era: str) -> bool:
    return era != "no-recoverable"


@dataclasses.dataclass
class LegacyDatabase:
    """A database holding a queue table of every era in SCHEMA, plus tables to leave alone."""

    dialect: str
    url: str
    engine: Engine
    schema_path: dict[str, str]
    snapshots: dict[str, list[tuple[object, ...]]] = dataclasses.field(default_factory=dict)

    def connection(self) -> Connection:
        return self.engine.connect()

    def config(self, connection: Connection | None = None, **kwargs: Any) -> Any:
        kwargs.setdefault("schemas", [SCHEMA])
        if self.dialect == "sqlite" and connection is None:
            raise AssertionError("SQLite's ATTACHed schema needs the test's connection")
        return environment.alembic_config(self.url, connection=connection, **kwargs)

    def run(self, action: str, revision: str, **kwargs: Any) -> None:
        """alembic.command.<action>(config, revision), as `sqlqueue migrate` builds the config."""
        if self.dialect == "sqlite":
            with self.connection() as connection:
                getattr(command, action)(self.config(connection, **kwargs), revision)
        else:
            getattr(command, action)(self.config(**kwargs), revision)

    def describe(self, table: str, schema: str | None = SCHEMA) -> dict[str, Any]:
        with self.connection() as connection:
            return shapes.describe(connection, table, schema)

    def snapshot(self, era: str) -> list[tuple[object, ...]]:
        with self.connection() as connection:
            return legacy.snapshot(connection, TABLES[era], SCHEMA, has_recoverable(era))

    def physical(self, table: str) -> list[tuple[object, ...]]:
        """What changes when a table or an index is rebuilt (file node, root page, oid)."""
        with self.connection() as connection:
            if self.dialect == "postgresql":
                relation = legacy.Names(connection.dialect, table, SCHEMA).qualified
                rows = connection.execute(
                    sa.text(
                        "SELECT c.relname, c.oid, c.relfilenode FROM pg_class AS c "
                        "WHERE c.oid = to_regclass(:r) OR c.oid IN "
                        "(SELECT indexrelid FROM pg_index WHERE indrelid = to_regclass(:r)) "
                        "ORDER BY c.relname"
                    ),
                    {"r": relation},
                )
            elif self.dialect == "mssql":
                relation = legacy.Names(connection.dialect, table, SCHEMA).qualified
                rows = connection.execute(
                    sa.text(
                        "SELECT i.name, i.index_id, i.type, p.partition_id FROM sys.indexes AS i "
                        "JOIN sys.partitions AS p ON p.object_id = i.object_id "
                        "AND p.index_id = i.index_id WHERE i.object_id = OBJECT_ID(:r) "
                        "ORDER BY i.index_id"
                    ),
                    {"r": relation},
                )
            else:
                quoted = connection.dialect.identifier_preparer.quote_identifier(SCHEMA)
                rows = connection.execute(
                    sa.text(
                        f"SELECT name, rootpage, sql FROM {quoted}.sqlite_master "
                        "WHERE tbl_name = :t ORDER BY name"
                    ),
                    {"t": table},
                )
            return [tuple(row) for row in rows]


def _attach(engine: Engine, directory: Path) -> None:
    @event.listens_for(engine, "connect")
    def attach(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        for number, name in enumerate((SCHEMA, FRESH, V1_REFERENCE)):
            quoted = '"' + name.replace('"', '""') + '"'
            cursor.execute(f"ATTACH DATABASE ? AS {quoted}", (str(directory / f"s{number}.db"),))
        cursor.close()


def _build(connection: Connection, dialect: str) -> dict[str, list[tuple[object, ...]]]:
    if dialect != "sqlite":
        for name in (SCHEMA, FRESH, V1_REFERENCE):
            connection.execute(sa.schema.CreateSchema(name))
    snapshots = {}
    for number, (era, table) in enumerate(TABLES.items()):
        legacy.create(connection, era, table, SCHEMA)
        rows = legacy.messages(MESSAGES, seed=number, has_recoverable=has_recoverable(era))
        legacy.insert(connection, table, SCHEMA, rows)
        names = legacy.Names(connection.dialect, table, SCHEMA)
        row_version = names.quote("RowVersion")
        # Gaps, and the newest rows gone: RowVersion must still never go back.
        connection.exec_driver_sql(
            f"DELETE FROM {names.qualified} WHERE {row_version} % 7 = 0 "
            f"OR {row_version} > {MESSAGES - 3}",
            execution_options={"no_parameters": True},
        )
        snapshots[era] = legacy.snapshot(connection, table, SCHEMA, has_recoverable(era))
        assert len(snapshots[era]) > 800
        # The shapes to compare with: a fresh current table and a v1 table of the same name.
        # SQL Server: 0004 keeps the heaps of .NET's layout (unless asked), as "heap" builds them.
        layout = "heap" if dialect == "mssql" and era in HEAP_ERAS else "clustered"
        fresh = build_queue_table(
            sa.MetaData(), table, FRESH, connection.dialect, sql_server_layout=layout
        )
        fresh.create(connection)
        legacy.create(connection, "v1", table, V1_REFERENCE)
    # Tables that must be left alone: not a queue; a queue outside the configured schema.
    other = legacy.Names(connection.dialect, NOT_A_QUEUE, SCHEMA)
    body_type = {"postgresql": "bytea", "sqlite": "BLOB"}.get(dialect, "varbinary(max)")
    connection.exec_driver_sql(
        f'CREATE TABLE {other.qualified} ("Id" CHAR(32) NOT NULL, "Headers" VARCHAR(50) NOT NULL, '
        f'"Body" {body_type}, "Expires" VARCHAR(20))',
        execution_options={"no_parameters": True},
    )
    legacy.create(connection, "v1", OUTSIDE, None)
    legacy.insert(connection, OUTSIDE, None, legacy.messages(10, seed=99))
    return snapshots


@pytest.fixture
def legacy_db(database: Any, tmp_path: Path) -> Iterator[LegacyDatabase]:
    if database.dialect == "sqlite":
        engine = db.create_engine(database.url)
        _attach(engine, tmp_path)
    else:
        engine = database.engine
    with engine.begin() as connection:
        snapshots = _build(connection, database.dialect)
    built = LegacyDatabase(database.dialect, database.url, engine, {}, snapshots)
    yield built
    if engine is not database.engine:
        engine.dispose()


def _expected_current(legacy_db: LegacyDatabase, era: str) -> dict[str, Any]:
    fresh = legacy_db.describe(TABLES[era], FRESH)
    if legacy_db.dialect == "postgresql":
        # NServiceBus's layout; every era's CorrelationId holds values (legacy.messages), so
        # revision 0008 keeps it as correlationid; Recoverable is gone from every era.
        return shapes.with_kept_correlation_id(fresh)
    return fresh if has_recoverable(era) else shapes.without_column(fresh, "Recoverable")


def _expected_v1(legacy_db: LegacyDatabase, era: str) -> dict[str, Any]:
    reference = legacy_db.describe(TABLES[era], V1_REFERENCE)
    if legacy_db.dialect == "postgresql":
        # The 0008 downgrade adds ReplyToAddress and Recoverable back at the end; no era keeps
        # track of a dropped Recoverable, so it comes back on that era too.
        return shapes.columns_in_any_order(reference)
    return reference if has_recoverable(era) else shapes.without_column(reference, "Recoverable")


def _describe_v1(legacy_db: LegacyDatabase, table: str) -> dict[str, Any]:
    shape = legacy_db.describe(table)
    return shapes.columns_in_any_order(shape) if legacy_db.dialect == "postgresql" else shape


def _assert_current_with_every_message(legacy_db: LegacyDatabase) -> None:
    for era, table in TABLES.items():
        assert legacy_db.describe(table) == _expected_current(legacy_db, era), era
        assert legacy_db.snapshot(era) == legacy_db.snapshots[era], era


def test_upgrade_head_brings_every_era_to_the_current_schema(
    legacy_db: LegacyDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    untouched = {
        NOT_A_QUEUE: legacy_db.describe(NOT_A_QUEUE),
        OUTSIDE: legacy_db.describe(OUTSIDE, None),
    }
    with caplog.at_level(logging.INFO, logger="sqlqueue_orm.migration"):
        legacy_db.run("upgrade", "head")

    _assert_current_with_every_message(legacy_db)
    assert legacy_db.describe(NOT_A_QUEUE) == untouched[NOT_A_QUEUE]
    assert legacy_db.describe(OUTSIDE, None) == untouched[OUTSIDE]

    # Progress: one line per table and step, with the row count.
    lines = [record.getMessage() for record in caplog.records]
    for era, table in TABLES.items():
        address = QueueAddress(table, SCHEMA)
        for revision in steps.STEPS:
            if not steps.applies_to(revision, legacy_db.dialect):
                continue
            pattern = re.compile(
                re.escape(f"queue {address}: {revision} upgrade: ") + r".* \((\d+) rows\)"
            )
            counts = [int(m.group(1)) for m in map(pattern.match, lines) if m]
            assert counts == [len(legacy_db.snapshots[era])], (era, revision)

    # FIFO: the messages come out in their old order, and new ones queue up behind them.
    with Transport(legacy_db.engine) as transport:
        for era, table in TABLES.items():
            address = QueueAddress(table, SCHEMA)
            old = legacy_db.snapshots[era]
            newest = transport.send(address, OutgoingMessage(b"after the upgrade"))
            received = []
            while batch := transport.receive(address, max_messages=97):
                received += batch
            assert [m.id for m in received[:-1]] == [uuid.UUID(str(row[0])) for row in old], era
            assert [m.row_version for m in received[:-1]] == [row[-1] for row in old], era
            assert [m.headers for m in received[:-1]] == [
                headers.deserialize(str(row[-3])) for row in old
            ], era
            assert received[-1].message_id == newest
            assert received[-1].row_version > max(row[-1] for row in old), era  # type: ignore[type-var]


def test_a_second_upgrade_changes_nothing(legacy_db: LegacyDatabase) -> None:
    legacy_db.run("upgrade", "head")
    before = {table: legacy_db.physical(table) for table in TABLES.values()}
    shapes_before = {table: legacy_db.describe(table) for table in TABLES.values()}

    legacy_db.run("upgrade", "head")  # at head: nothing runs
    # Every step again, on tables that are already current: each must find nothing to do.
    legacy_db.run("stamp", "base")
    legacy_db.run("upgrade", "head")

    for table in TABLES.values():
        assert legacy_db.physical(table) == before[table], table
        assert legacy_db.describe(table) == shapes_before[table], table
    for era in TABLES:
        assert legacy_db.snapshot(era) == legacy_db.snapshots[era], era


def test_downgrade_to_base_and_upgrade_again_round_trips(legacy_db: LegacyDatabase) -> None:
    legacy_db.run("upgrade", "head")
    legacy_db.run("downgrade", "base")

    for era, table in TABLES.items():
        assert _describe_v1(legacy_db, table) == _expected_v1(legacy_db, era), era
        assert legacy_db.snapshot(era) == legacy_db.snapshots[era], era

    legacy_db.run("upgrade", "head")
    _assert_current_with_every_message(legacy_db)


def test_alembic_check_reports_no_drift_for_the_shared_tables(legacy_db: LegacyDatabase) -> None:
    legacy_db.run("upgrade", "head")
    if legacy_db.dialect == "sqlite":
        with legacy_db.connection() as connection:
            command.check(legacy_db.config(connection))
    else:
        command.check(legacy_db.config())


@only("sqlite", "postgresql")
def test_named_queues_narrow_the_run(legacy_db: LegacyDatabase) -> None:
    v1, heap = TABLES["v1"], TABLES["heap"]
    before_heap = legacy_db.describe(heap)
    legacy_db.run("upgrade", "head", queues=[f"[{v1}]@[{SCHEMA}]"])

    assert legacy_db.describe(v1) == _expected_current(legacy_db, "v1")
    assert legacy_db.describe(heap) == before_heap
    assert legacy_db.snapshot("v1") == legacy_db.snapshots["v1"]


@only("sqlite", "postgresql")
@pytest.mark.parametrize(
    ("queue", "error"),
    [("no such queue", "no such table"), (NOT_A_QUEUE, "not a queue table")],
)
def test_a_named_table_that_is_no_queue_is_refused(
    legacy_db: LegacyDatabase, queue: str, error: str
) -> None:
    before = legacy_db.describe(TABLES["v1"])
    with pytest.raises(exceptions.ConfigurationError, match=error):
        legacy_db.run("upgrade", "head", queues=[queue])
    assert legacy_db.describe(TABLES["v1"]) == before


# -- through the command lines ----------------------------------------------------------------
def _v1_in_default_schema(connection: Connection) -> list[tuple[object, ...]]:
    legacy.create(connection, "v1", "v1 queue-x.y", None)
    legacy.insert(connection, "v1 queue-x.y", None, legacy.messages(MESSAGES, seed=5))
    return legacy.snapshot(connection, "v1 queue-x.y", None)


@only("sqlite", "postgresql")
def test_alembic_console_script_from_the_repository(database: Any, tmp_path: Path) -> None:
    """`alembic -x url=... upgrade head` from a checkout: alembic.ini + alembic/env.py."""
    with database.engine.begin() as connection:
        before = _v1_in_default_schema(connection)
    alembic = Path(sys.executable).with_name("alembic")
    env = {**os.environ, "SQLQUEUE_URL": "sqlite:///must-not-be-used.db"}
    result = subprocess.run(
        [str(alembic), "-x", f"url={database.url}", "upgrade", "head"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "queue v1 queue-x.y: 0002_headers_nvarchar upgrade" in result.stderr
    summary = "queue v1 queue-x.y: upgraded: 0001_expires_index, 0002_headers_nvarchar, 0004_"
    assert summary in result.stderr  # the sweep's one line per table
    assert not (REPO / "must-not-be-used.db").exists()
    with database.engine.begin() as connection:
        build_queue_table(sa.MetaData(), "fresh twin", None, connection.dialect).create(connection)
    with database.engine.connect() as connection:
        assert legacy.snapshot(connection, "v1 queue-x.y", None) == before
        upgraded = shapes.describe(connection, "v1 queue-x.y", None)
        twin = shapes.describe(connection, "fresh twin", None)
    if database.dialect == "postgresql":
        twin = shapes.with_kept_correlation_id(twin)
    assert upgraded["columns"] == twin["columns"]

    def layout(shape: dict[str, Any]) -> list[tuple[str, object]]:
        return sorted((str(i["keys"]), i["where"]) for i in shape["indexes"].values())

    assert layout(upgraded) == layout(twin)


@only("sqlite", "postgresql")
def test_sqlqueue_migrate(database: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with database.engine.begin() as connection:
        before = _v1_in_default_schema(connection)

    assert cli.main(["--url", database.url, "migrate"]) == 0

    with database.engine.connect() as connection:
        assert legacy.snapshot(connection, "v1 queue-x.y", None) == before
        indexes = shapes.describe(connection, "v1 queue-x.y", None)["indexes"]
        assert any(
            index["keys"] in (["Expires"], ['"Expires"'], ["expires"]) for index in indexes.values()
        )
    assert cli.main(["--url", database.url, "migrate", "--downgrade", "base"]) == 0


@only("sqlite")
def test_sqlqueue_migrate_sql_refuses_sqlite(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--url", database.url, "migrate", "--sql"]) == 2
    assert "SQL Server and PostgreSQL" in capsys.readouterr().err


# -- leftovers and odd shapes ----------------------------------------------------------------
@only("postgresql")
def test_an_invalid_index_left_by_a_failed_concurrent_build_is_rebuilt(database: Any) -> None:
    table = "half built"
    with database.engine.begin() as connection:
        legacy.create(connection, "v1", table, None)
        legacy.insert(connection, table, None, legacy.messages(50, seed=3))
        names = legacy.Names(connection.dialect, table, None)
        connection.exec_driver_sql(f"UPDATE {names.qualified} SET \"Expires\" = '2024-01-01'")
    name = names.index("Index_Expires")
    with database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        with pytest.raises(sa.exc.IntegrityError):  # duplicate keys: the build fails ...
            connection.exec_driver_sql(
                f'CREATE UNIQUE INDEX CONCURRENTLY {name} ON {names.qualified} ("Expires")'
            )
        assert (
            shapes.describe(connection, table, None)["indexes"][name.strip('"')]["valid"] is False
        )

    command.upgrade(environment.alembic_config(database.url), "head")  # ... and is replaced

    with database.engine.begin() as connection:
        connection.execute(sa.schema.CreateSchema("fresh"))
        build_queue_table(sa.MetaData(), table, "fresh", connection.dialect).create(connection)
    with database.engine.connect() as connection:
        assert shapes.describe(connection, table, None) == shapes.with_kept_correlation_id(
            shapes.describe(connection, table, "fresh")
        )


@only("postgresql")
def test_an_integer_serial_row_version_becomes_bigint_identity(database: Any) -> None:
    table = "int serial q"
    with database.engine.begin() as connection:
        legacy.create(connection, "v1", table, None)
        names = legacy.Names(connection.dialect, table, None)
        connection.exec_driver_sql(
            f'ALTER TABLE {names.qualified} ALTER COLUMN "RowVersion" TYPE integer'
        )
        legacy.insert(connection, table, None, legacy.messages(100, seed=4))
        before = legacy.snapshot(connection, table, None)
        connection.execute(sa.schema.CreateSchema("fresh"))
        build_queue_table(sa.MetaData(), table, "fresh", connection.dialect).create(connection)

    command.upgrade(environment.alembic_config(database.url), "head")

    with database.engine.connect() as connection:
        assert shapes.describe(connection, table, None) == shapes.with_kept_correlation_id(
            shapes.describe(connection, table, "fresh")
        )
        assert legacy.snapshot(connection, table, None) == before
    with Transport(database.engine) as transport:
        transport.send(table, OutgoingMessage(b"next"))
        assert transport.receive(table, max_messages=200)[-1].row_version == 101


@only("sqlite")
def test_the_sqlite_rebuild_keeps_the_body_string_column(database: Any) -> None:
    from sqlqueue_orm import schema

    with database.engine.begin() as connection:
        before = _v1_in_default_schema(connection)
        connection.exec_driver_sql(
            schema.body_string_statement(connection.dialect, QueueAddress("v1 queue-x.y"))
        )

    command.upgrade(environment.alembic_config(database.url), "head")

    with database.engine.connect() as connection:
        assert legacy.snapshot(connection, "v1 queue-x.y", None) == before
        columns = {c[0]: c for c in shapes.describe(connection, "v1 queue-x.y", None)["columns"]}
        assert columns["BodyString"][5] == 2  # still a generated (virtual) column
        assert columns["Headers"][1] == "TEXT"


# -- NServiceBus's PostgreSQL layout (revision 0008) -------------------------------------------
@only("postgresql")
def test_every_upgraded_era_serves_the_dotnet_transports_statements(
    legacy_db: LegacyDatabase,
) -> None:
    from tests.integration.test_nservicebus_postgresql import DotNetEndpoint

    legacy_db.run("upgrade", "head")
    for era, table in TABLES.items():
        endpoint = DotNetEndpoint(legacy_db.engine, QueueAddress(table, SCHEMA))
        old = legacy_db.snapshots[era]
        assert endpoint.peek() >= len(old), era  # max - min + 1 over the gaps
        endpoint.send(b"from .NET", {"n": "last"})
        received = endpoint.receive_all()
        # FIFO, ids, headers text and bodies byte for byte, then the new one behind them.
        assert [(row[0], row[2], row[3]) for row in received[:-1]] == [
            (row[0], row[-3], row[-2]) for row in old
        ], era
        assert received[-1][3] == b"from .NET", era


@only("postgresql")
def test_two_rows_with_one_id_stop_the_upgrade_naming_the_table(database: Any) -> None:
    table = "dup ids q"
    with database.engine.begin() as connection:
        legacy.create(connection, "heap", table, None)
        rows = legacy.messages(5, seed=8)
        rows[3]["Id"] = rows[1]["Id"]
        legacy.insert(connection, table, None, rows)
        before = legacy.snapshot(connection, table, None)
    config = environment.alembic_config(database.url)
    with pytest.raises(sa.exc.DBAPIError, match=r"dup ids q.*share an Id"):
        command.upgrade(config, "head")
    with database.engine.connect() as connection:  # the step rolled back: nothing changed
        assert legacy.snapshot(connection, table, None) == before
    with database.engine.begin() as connection:  # the fix the message names, then again
        names = legacy.Names(connection.dialect, table, None)
        connection.exec_driver_sql(f'DELETE FROM {names.qualified} WHERE "RowVersion" = 4')
    command.upgrade(config, "head")
    with database.engine.connect() as connection:
        assert legacy.snapshot(connection, table, None) == [r for r in before if r[-1] != 4]


@only("postgresql")
def test_the_body_string_column_follows_and_an_old_table_is_reported(
    database: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlqueue_orm import schema

    with database.engine.begin() as connection:
        before = _v1_in_default_schema(connection)
        connection.exec_driver_sql(
            'ALTER TABLE "v1 queue-x.y" ADD COLUMN "BodyString" TEXT '
            "GENERATED ALWAYS AS (encode(\"Body\", 'escape')) STORED"
        )
    with caplog.at_level(logging.WARNING), database.engine.connect() as connection:
        problems = schema.SchemaInspector().warn(connection, QueueAddress("v1 queue-x.y"))
    assert any("sqlqueue migrate" in p and "PostgreSQL" in p for p in problems)
    assert any("queue v1 queue-x.y" in r.getMessage() for r in caplog.records)
    with Transport(database.engine) as transport:  # not a transient error retried forever
        with pytest.raises(exceptions.SchemaOutdated, match=r"no column id.*sqlqueue migrate"):
            transport.send("v1 queue-x.y", OutgoingMessage(b"too early"))

    command.upgrade(environment.alembic_config(database.url), "head")

    with database.engine.connect() as connection:
        assert legacy.snapshot(connection, "v1 queue-x.y", None) == before
        body_strings = connection.exec_driver_sql(
            'SELECT bodystring, encode(body, \'escape\') FROM "v1 queue-x.y"'
        ).all()
        assert schema.SchemaInspector().problems(connection, QueueAddress("v1 queue-x.y")) == []
    assert body_strings and all(row[0] == row[1] for row in body_strings)
    with Transport(database.engine) as transport:
        transport.send("v1 queue-x.y", OutgoingMessage(b"new"))
        assert transport.receive("v1 queue-x.y", max_messages=2000)[-1].body == b"new"
