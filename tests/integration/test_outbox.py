"""OutboxData: its shape, the Operations JSON, de-duplication, cleanup, and its T-SQL."""

from __future__ import annotations

import base64
import datetime as dt
import importlib
import json
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql, postgresql, sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from sqlqueue_orm import OutgoingMessage, exceptions, headers
from sqlqueue_orm.config import CleanupSettings, DispatcherSettings, parse_duration
from sqlqueue_orm.models import OutboxData
from sqlqueue_orm.models.base import Base
from sqlqueue_orm.models.outbox import outbox_table
from sqlqueue_orm.sending import outbox_statements
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import (
    OutboxOperation,
    deserialize_operations,
    parse_timespan,
    serialize_operations,
    utc_now,
)
from sqlqueue_orm.sending.routing import Routing
from sqlqueue_orm.session import Outcome, UnitOfWork
from tests.conftest import only
from testsupport.outbox_app import (
    REPO,
    Order,
    count,
    install,
    outbox_rows,
    queue_message_ids,
    sqlqueue_command,
)


@pytest.fixture
def app(database):
    transport = database.transport()
    install(transport, "billing")
    return transport


# -- the table ----------------------------------------------------------------------------
def test_outbox_data_is_in_the_alembic_metadata():
    assert Base.metadata.tables["OutboxData"] is OutboxData.__table__


def test_mssql_ddl_is_column_compatible_with_nservicebus():
    table = outbox_table()
    dialect = mssql.dialect()
    ddl = str(CreateTable(table).compile(dialect=dialect)).strip()
    assert ddl == (
        "CREATE TABLE [OutboxData] (\n"
        "\t[MessageId] NVARCHAR(200) NOT NULL, \n"
        "\t[Dispatched] BIT NOT NULL DEFAULT 0, \n"
        "\t[DispatchedAt] DATETIME NULL, \n"
        "\t[PersistenceVersion] VARCHAR(23) NOT NULL, \n"
        "\t[Operations] NVARCHAR(max) NOT NULL, \n"
        "\tCONSTRAINT [pk_OutboxData] PRIMARY KEY NONCLUSTERED ([MessageId])\n"
        ")"
    )
    indexes = sorted(str(CreateIndex(index).compile(dialect=dialect)) for index in table.indexes)
    assert indexes == [
        "CREATE NONCLUSTERED INDEX [Index_DispatchedAt] ON [OutboxData] ([DispatchedAt]) "
        "WHERE [Dispatched] = 1",
        "CREATE NONCLUSTERED INDEX [Index_Pending] ON [OutboxData] ([DispatchedAt]) "
        "WHERE [Dispatched] = 0",
    ]


def test_partial_indexes_on_postgresql_and_sqlite():
    for dialect, true, false in (
        (postgresql.dialect(), "true", "false"),
        (sqlite.dialect(), "1", "0"),
    ):
        rendered = sorted(
            str(CreateIndex(index).compile(dialect=dialect)) for index in outbox_table().indexes
        )
        assert rendered == [
            f'CREATE INDEX "Index_DispatchedAt" ON "OutboxData" ("DispatchedAt") '
            f'WHERE "Dispatched" = {true}',
            f'CREATE INDEX "Index_Pending" ON "OutboxData" ("DispatchedAt") '
            f'WHERE "Dispatched" = {false}',
        ]


def test_created_table_has_the_nservicebus_columns(database, app):
    inspector = sa.inspect(database.engine)
    columns = {column["name"]: column for column in inspector.get_columns("OutboxData")}
    assert list(columns) == [
        "MessageId",
        "Dispatched",
        "DispatchedAt",
        "PersistenceVersion",
        "Operations",
    ]
    assert [name for name, column in columns.items() if column["nullable"]] == ["DispatchedAt"]
    assert columns["MessageId"]["type"].length == 200
    assert columns["PersistenceVersion"]["type"].length == 23
    assert inspector.get_pk_constraint("OutboxData")["constrained_columns"] == ["MessageId"]
    assert {index["name"] for index in inspector.get_indexes("OutboxData")} == {
        "Index_DispatchedAt",
        "Index_Pending",
    }
    # NServiceBus inserts only MessageId, Operations and PersistenceVersion: the rest defaults.
    with database.engine.begin() as connection:
        connection.execute(
            sa.insert(outbox_table()).values(
                MessageId="from-nsb", Operations="[]", PersistenceVersion="8.1.0"
            )
        )
        row = connection.execute(
            sa.text('SELECT "Dispatched", "DispatchedAt" FROM "OutboxData"')
        ).one()
    assert (bool(row[0]), row[1]) == (False, None)


def _migration():
    return importlib.import_module("sqlqueue_orm.migrations_versions.0005_outbox_data")


def _run_migration(engine, step):
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    with engine.begin() as connection:
        context = MigrationContext.configure(connection)
        with Operations.context(context):
            getattr(_migration(), step)()


def test_the_revision_creates_what_the_model_declares_and_is_idempotent(database):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    module = _migration()
    assert (module.revision, module.down_revision) == ("0005_outbox_data", "0004_rowversion_layout")
    _run_migration(database.engine, "upgrade")
    _run_migration(database.engine, "upgrade")  # again: nothing to do, no error
    with database.engine.connect() as connection:
        diffs = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert [diff for diff in diffs if "OutboxData" in repr(diff)] == []
    with database.engine.connect() as connection:
        predicates = _index_predicates(connection)
    # autogenerate does not compare partial-index predicates: check them here
    expected = {
        "sqlite": ('"Dispatched" = 1', '"Dispatched" = 0'),
        "postgresql": ('("Dispatched" = true)', '("Dispatched" = false)'),
        "mssql": ("([Dispatched]=(1))", "([Dispatched]=(0))"),
    }[database.dialect]
    assert (predicates["Index_DispatchedAt"], predicates["Index_Pending"]) == expected
    _run_migration(database.engine, "downgrade")
    assert not sa.inspect(database.engine).has_table("OutboxData")


def test_the_revision_adds_only_the_missing_index_to_an_nservicebus_table(database):
    # As NServiceBus's script makes it: no Index_Pending.
    table = outbox_table()
    with database.engine.begin() as connection:
        table.create(connection)
        on_table = ' ON "OutboxData"' if database.dialect == "mssql" else ""
        connection.execute(sa.text(f'DROP INDEX "Index_Pending"{on_table}'))
    _run_migration(database.engine, "upgrade")
    names = {index["name"] for index in sa.inspect(database.engine).get_indexes("OutboxData")}
    assert names == {"Index_DispatchedAt", "Index_Pending"}


def _index_predicates(connection):
    if connection.dialect.name == "mssql":
        rows = connection.execute(
            sa.text(
                "SELECT name, filter_definition FROM sys.indexes "
                "WHERE object_id = OBJECT_ID('OutboxData') AND name LIKE 'Index[_]%'"
            )
        )
        return {name: definition for name, definition in rows}
    if connection.dialect.name == "postgresql":
        rows = connection.execute(
            sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'OutboxData'")
        )
        return {
            name: definition.split(" WHERE ")[-1]
            for name, definition in rows
            if name.startswith("Index_")
        }
    rows = connection.execute(
        sa.text(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'OutboxData'"
        )
    )
    return {name: definition.split(" WHERE ")[1] for name, definition in rows if definition}


# -- the Operations JSON -----------------------------------------------------------------
def test_operations_have_the_serializable_operation_shape():
    message = OutgoingMessage(
        b"\x00\xffbinary", headers={"a/b": "c"}, message_id="m-1", time_to_be_received=90
    )
    operation = OutboxOperation.from_prepared("billing@[sales]", message.prepare())
    [data] = json.loads(serialize_operations([operation]))
    assert list(data) == ["MessageId", "Options", "Headers", "Body"]
    assert data["MessageId"] == "m-1"
    assert data["Options"] == {"Destination": "billing@[sales]", "TimeToBeReceived": "00:01:30"}
    assert data["Headers"]["a/b"] == "c"
    assert data["Headers"][headers.MESSAGE_ID] == "m-1"
    assert data["Headers"][headers.TIME_TO_BE_RECEIVED] == "00:01:30"
    assert base64.b64decode(data["Body"]) == b"\x00\xffbinary"
    [back] = deserialize_operations(serialize_operations([operation]))
    assert back == operation
    assert back.ttbr_ms == 90_000
    prepared = back.prepare()
    assert (prepared.message_id, prepared.body, prepared.ttbr_ms) == (
        "m-1",
        b"\x00\xffbinary",
        90_000,
    )
    assert headers.deserialize(prepared.headers) == operation.headers


def test_operations_written_by_nservicebus_are_read():
    text = json.dumps(
        [
            {
                "MessageId": "nsb-1",
                "Options": {
                    "Destination": "Sales",
                    "TimeToBeReceived": "1.02:03:04.5000000",
                    "DeliverAt": "ignored",
                },
                "Headers": {"NServiceBus.MessageId": "nsb-1"},
                "Body": None,
            }
        ]
    )
    [operation] = deserialize_operations(text)
    assert operation.destination == "Sales" and operation.body is None
    assert operation.ttbr_ms == (86_400 + 2 * 3600 + 3 * 60 + 4.5) * 1000


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("{}", "not an array"),
        ('[{"MessageId": "x", "Options": {"EventType": "T"}}]', "no Destination"),
        ('[{"MessageId": "x", "Options": {"Destination": "q"}, "Body": "%%%"}]', "base64"),
        ('[{"MessageId": "", "Options": {"Destination": "q"}}]', "MessageId"),
        (
            '[{"MessageId": "x", "Options": {"Destination": "q", "TimeToBeReceived": "soon"}}]',
            "'soon'",
        ),
    ],
)
def test_unreadable_operations_are_named(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        deserialize_operations(text)


def test_timespan_round_trip():
    for seconds in (0.001, 1, 59.5, 3600, 86_400 * 3 + 1.25):
        assert parse_timespan(headers.format_timespan(seconds)) == pytest.approx(seconds)
    with pytest.raises(ValueError, match="'1:2'"):
        parse_timespan("1:2")


# -- de-duplication ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["direct", "outbox"])
def test_the_same_incoming_message_handled_twice_acts_and_sends_once(database, app, mode):
    outcomes, runs = [], 0
    for _ in range(2):
        with UnitOfWork(app, mode=mode, incoming_message_id="incoming-7") as uow:
            outcomes.append(uow.outcome)
            if uow.already_handled:
                continue
            runs += 1
            uow.session.add(Order(customer="ann", total=10))
            uow.send("billing", OutgoingMessage(b"invoice", message_id="out-7"))
    assert outcomes == [Outcome.RUN, Outcome.ALREADY_HANDLED]
    assert runs == 1
    assert count(database.engine, Order) == 1
    assert queue_message_ids(database.engine, "billing") == ["out-7"]
    assert outbox_rows(database.engine) == [("incoming-7", True, "[]")]


def test_work_done_in_an_already_handled_unit_is_not_committed(database, app):
    with UnitOfWork(app, incoming_message_id="m") as uow:
        uow.session.add(Order(customer="ann", total=10))
    with UnitOfWork(app, incoming_message_id="m") as uow:
        assert uow.already_handled
        uow.session.add(Order(customer="again", total=10))  # ignored the flag: rolled back
        with pytest.raises(exceptions.DuplicateMessage, match="'m'"):
            uow.send("billing", OutgoingMessage(b"x"))
    assert count(database.engine, Order) == 1


def test_a_stored_but_undispatched_message_is_redispatched_not_rerun(database, app):
    with UnitOfWork(app, mode="outbox", incoming_message_id="in-1", dispatch_inline=False) as uow:
        uow.session.add(Order(customer="ann", total=10))
        uow.send_many(
            "billing",
            [OutgoingMessage(b"1", message_id="o-1"), OutgoingMessage(b"2", message_id="o-2")],
        )
    assert count(database.engine, "billing") == 0  # as if the process died after the commit
    with UnitOfWork(app, mode="outbox", incoming_message_id="in-1") as uow:
        assert uow.outcome is Outcome.REDISPATCHED
    assert queue_message_ids(database.engine, "billing") == ["o-1", "o-2"]
    with UnitOfWork(app, mode="outbox", incoming_message_id="in-1") as uow:
        assert uow.outcome is Outcome.ALREADY_HANDLED
    assert queue_message_ids(database.engine, "billing") == ["o-1", "o-2"]
    assert count(database.engine, Order) == 1


@only("postgresql", "mssql")
def test_concurrent_units_for_one_message_leave_exactly_one_committed(database, app):
    # Interleaved on purpose: both look, both find nothing, both do the work; the primary key
    # lets the first commit and turns the second into DuplicateMessage (rolled back).
    first, second = (UnitOfWork(app, mode="outbox", incoming_message_id="twice") for _ in "ab")
    first.__enter__()
    second.__enter__()
    assert first.outcome is second.outcome is Outcome.RUN
    for uow, who in ((first, "first"), (second, "second")):
        uow.session.add(Order(customer=who, total=1))
        uow.send("billing", OutgoingMessage(who))
    first.__exit__(None, None, None)
    with pytest.raises(exceptions.DuplicateMessage, match="'twice'"):
        second.__exit__(None, None, None)
    assert [order for (order,) in _customers(database.engine)] == ["first"]
    assert count(database.engine, "billing") == 1


def _customers(engine):
    with engine.connect() as connection:
        return connection.execute(sa.select(Order.customer).where(Order.customer != "x")).all()


def test_concurrent_threads_handling_one_message_commit_once(database, app):
    barrier = threading.Barrier(4)
    results = []

    def handle(number):
        barrier.wait()
        try:
            with UnitOfWork(app, mode="outbox", incoming_message_id="race") as uow:
                if uow.already_handled:
                    results.append(uow.outcome.value)
                    return
                uow.session.add(Order(customer=f"thread {number}", total=1))
                uow.send("billing", OutgoingMessage(b"x", message_id="race-out"))
            results.append("committed")
        except exceptions.DuplicateMessage:
            results.append("duplicate")

    threads = [threading.Thread(target=handle, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results).count("committed") == 1 and len(results) == 4
    assert count(database.engine, Order) == 1
    assert queue_message_ids(database.engine, "billing") == ["race-out"]


# -- cleanup -----------------------------------------------------------------------------
def test_cleanup_deletes_only_dispatched_records_older_than_the_cutoff(database, app):
    outbox = Outbox(app)
    now = utc_now()
    old, recent = now - dt.timedelta(days=8), now - dt.timedelta(days=6)
    with database.engine.begin() as connection:
        for number in range(7):
            outbox.store(connection, f"old-{number}", [], dispatched=True, now=old)
        outbox.store(connection, "recent", [], dispatched=True, now=recent)
        outbox.store(connection, "pending-old", [], dispatched=False, now=old)
    assert outbox.cleanup(dt.timedelta(days=7), batch_size=3) == 7  # batches of 3, 3, 1
    assert sorted(row[0] for row in outbox_rows(database.engine)) == ["pending-old", "recent"]
    assert outbox.cleanup(dt.timedelta(days=7)) == 0
    assert outbox.cleanup(dt.timedelta(days=5)) == 1
    assert [row[0] for row in outbox_rows(database.engine)] == ["pending-old"]


@only("sqlite", "postgresql")
def test_cleanup_command(database, app):
    outbox = Outbox(app)
    with database.engine.begin() as connection:
        outbox.store(connection, "old", [], dispatched=True, now=utc_now() - dt.timedelta(hours=13))
        outbox.store(connection, "new", [], dispatched=True)
    command = [*sqlqueue_command(), "--url", database.url, "outbox", "cleanup"]
    result = subprocess.run(
        [*command, "--older-than", "12h"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("deleted 1 ")
    assert [row[0] for row in outbox_rows(database.engine)] == ["new"]
    result = subprocess.run(
        [*command, "--older-than", "7 days"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "'7 days'" in result.stderr


def test_durations():
    assert parse_duration("7d") == dt.timedelta(days=7)
    assert parse_duration("12h") == dt.timedelta(hours=12)
    assert parse_duration("30m") == dt.timedelta(minutes=30)
    assert parse_duration("45s") == dt.timedelta(seconds=45)
    assert parse_duration("2W") == dt.timedelta(weeks=2)
    for bad in ("", "7", "d", "1.5h", "-3d", "7 days", "7dd"):
        with pytest.raises(exceptions.ConfigurationError, match=repr(bad).replace(".", r"\.")):
            parse_duration(bad)


def test_settings_name_bad_values():
    assert DispatcherSettings(grace_period=0).grace_period == 0
    for kwargs, name in (
        ({"batch_size": 0}, "batch_size 0"),
        ({"batch_size": True}, "batch_size True"),
        ({"interval": 0}, "interval 0"),
        ({"grace_period": -1}, "grace_period -1"),
        ({"interval": float("nan")}, "interval nan"),
        ({"initial_backoff": 5, "max_backoff": 1}, "max_backoff 1"),
    ):
        with pytest.raises(exceptions.ConfigurationError, match=name):
            DispatcherSettings(**kwargs)
    with pytest.raises(exceptions.ConfigurationError, match="batch_size 0"):
        CleanupSettings(batch_size=0)


# -- routing ------------------------------------------------------------------------------
def test_routes_load_from_json_and_toml(tmp_path):
    json_file = tmp_path / "routes.json"
    json_file.write_text(json.dumps({"billing": "sqlite:///b.db", "ledger@[acct]": "sqlite://"}))
    toml_file = tmp_path / "routes.toml"
    toml_file.write_text('[routes]\n"billing" = "sqlite:///b.db"\n"ledger@[acct]" = "sqlite://"\n')
    for file in (json_file, toml_file):
        routing = Routing.load(file)
        assert routing.url_for("billing") == "sqlite:///b.db"
        assert routing.url_for("ledger@acct") == "sqlite://"
        assert routing.url_for("orders") is None


@pytest.mark.parametrize(
    ("content", "suffix", "complaint"),
    [
        ("{nope", ".json", "not valid JSON"),
        ('["a"]', ".json", "table of queue address"),
        ('{"billing": 3}', ".json", "URL 3"),
        ('{"billing": "not a url"}', ".json", "'not a url'"),
        ('billing = "sqlite://"\n"a@b@c@d" = "sqlite://"', ".toml", "a@b@c@d"),
    ],
)
def test_bad_routes_files_are_named(tmp_path, content, suffix, complaint):
    file = tmp_path / f"routes{suffix}"
    file.write_text(content)
    with pytest.raises(exceptions.ConfigurationError, match=complaint) as raised:
        Routing.load(file)
    assert str(file) in str(raised.value)
    with pytest.raises(exceptions.ConfigurationError, match="cannot be read"):
        Routing.load(tmp_path / "missing.toml")


# -- golden T-SQL ------------------------------------------------------------------------


def test_claim_sql_skips_locked_rows_on_postgresql():
    text = str(outbox_statements.claim_statement(limit=5).compile(dialect=postgresql.dialect()))
    assert text.endswith("FOR UPDATE SKIP LOCKED")
    assert '"Dispatched" = false' in text and "ORDER BY" in text


# -- the documented example ---------------------------------------------------------------
def _fenced(markdown, language):
    blocks, current, inside = [], [], None
    for line in markdown.splitlines(keepends=True):
        if inside is None and line.startswith("```"):
            inside = line[3:].strip()
            current = []
        elif inside is not None and line.startswith("```"):
            blocks.append((inside, "".join(current)))
            inside = None
        elif inside is not None:
            current.append(line)
    return [text for kind, text in blocks if kind == language]


@only("sqlite", "postgresql")
def test_the_documented_example_runs_as_written(database, tmp_path):
    markdown = (REPO / "docs" / "outbox.md").read_text()
    code, expected = _fenced(markdown, "python")[0], _fenced(markdown, "text")[0]
    assert code == (REPO / "examples" / "outbox_example.py").read_text()
    # The page shows the example and, right after it, what it prints.
    assert f"```python\n{code}```\n\nIt prints:\n\n```text\n{expected}```" in markdown
    script = tmp_path / "example.py"
    script.write_text(code)
    args = [] if database.dialect == "sqlite" else [database.url, f"sqlite:///{tmp_path}/l.db"]
    result = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected


@only("sqlite", "postgresql")
def test_sqlqueue_migrate_runs_the_revision_in_the_chain(database):
    def migrate(*args):
        result = subprocess.run(
            [*sqlqueue_command(), "--url", database.url, "migrate", *args],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr

    transport = database.transport()
    Outbox(transport).create_table()  # made before (as NServiceBus would): adopted, not redone
    migrate()
    with database.engine.connect() as connection:
        assert _index_predicates(connection).keys() == {"Index_DispatchedAt", "Index_Pending"}
    transport.create_queue("billing")
    with UnitOfWork(transport, mode="outbox") as uow:
        uow.send("billing", OutgoingMessage(b"x"))
    assert count(database.engine, "billing") == 1
    migrate("--downgrade", "0004_rowversion_layout")
    assert not sa.inspect(database.engine).has_table("OutboxData")
    migrate()
    assert sa.inspect(database.engine).has_table("OutboxData")
