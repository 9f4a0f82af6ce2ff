"""Outbox sends to a queue in another database: exactly once, through its OutboxDelivery table.

The dispatcher commits a message in the destination's database together with an OutboxDelivery
row, then marks its record dispatched in its own database. A crash between the two commits used
to send the message again (issue 10, defect 2); now the retry finds the row and skips it.
"""

from __future__ import annotations

import collections
import datetime as dt
import importlib
import io
import json
import logging
import random
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql, postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.models import OutboxDelivery
from sqlqueue_orm.models.base import Base
from sqlqueue_orm.models.outbox_delivery import delivery_key, outbox_delivery_table
from sqlqueue_orm.sending import outbox_statements
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import OutboxOperation, utc_now
from sqlqueue_orm.sending.routing import Routing
from tests.conftest import only
from testsupport.databases import drop_postgres_database, new_postgres_database
from testsupport.outbox_app import REPO, install, outbox_rows, queue_message_ids, sqlqueue_command

DELIVERY_COLUMNS = ["Destination", "MessageId", "OutboxRecordId", "DeliveredAt"]


@pytest.fixture
def app(database):
    transport = database.transport()
    install(transport, "billing")
    return transport


@pytest.fixture
def remote_url(database, tmp_path, request):
    """A second, empty database of the same kind: where the ``ledger`` queue lives."""
    if database.dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    admin = request.getfixturevalue("postgres_admin")
    url = new_postgres_database(admin)
    yield url
    drop_postgres_database(admin, url)


@pytest.fixture
def remote(remote_url):
    transport = Transport(remote_url)
    transport.create_queue("ledger")
    yield transport
    transport.close()


def _operation(destination, message_id, body=b"x"):
    return OutboxOperation.from_prepared(
        destination, OutgoingMessage(body, message_id=message_id).prepare()
    )


def _store(engine, outbox, records, now=None):
    with engine.begin() as connection:
        for record_id, operations in records:
            outbox.store(connection, record_id, operations, now=now)


def _deliveries(engine):
    table = outbox_delivery_table()
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(table.c.Destination, table.c.MessageId, table.c.OutboxRecordId).order_by(
                table.c.MessageId
            )
        ).all()
    return [tuple(row) for row in rows]


class _FailTheMark:
    """Makes the local mark fail once: the destination has committed, this database rolls back."""

    def __init__(self, engine):
        self.engine, self.fired = engine, 0
        sa.event.listen(engine, "before_cursor_execute", self)

    def __call__(self, _conn, _cursor, statement, *_args):
        if statement.startswith('UPDATE "OutboxData" SET "Dispatched"=') and not self.fired:
            self.fired += 1
            raise RuntimeError("the dispatcher died between the two commits")

    def remove(self):
        sa.event.remove(self.engine, "before_cursor_execute", self)


# -- the table and its revision -----------------------------------------------------------
def test_the_table_is_in_the_alembic_metadata_and_its_t_sql():
    table = outbox_delivery_table()
    assert Base.metadata.tables["OutboxDelivery"] is OutboxDelivery.__table__
    dialect = mssql.dialect()
    assert str(CreateTable(table).compile(dialect=dialect)).strip() == (
        "CREATE TABLE [OutboxDelivery] (\n"
        "\t[Destination] NVARCHAR(200) NOT NULL, \n"
        "\t[MessageId] NVARCHAR(200) NOT NULL, \n"
        "\t[OutboxRecordId] NVARCHAR(200) NOT NULL, \n"
        "\t[DeliveredAt] DATETIME NOT NULL, \n"
        "\tCONSTRAINT [pk_OutboxDelivery] PRIMARY KEY ([Destination], [MessageId])\n"
        ")"
    )
    assert [str(CreateIndex(index).compile(dialect=dialect)) for index in table.indexes] == [
        "CREATE INDEX [ix_OutboxDelivery_DeliveredAt] ON [OutboxDelivery] ([DeliveredAt])"
    ]


def _migration():
    return importlib.import_module("sqlqueue_orm.migrations_versions.0007_outbox_delivery")


def _run_migration(engine, step):
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    with engine.begin() as connection:
        context = MigrationContext.configure(connection)
        with Operations.context(context):
            getattr(_migration(), step)()


def test_the_revision_renders_as_t_sql_offline():
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    output = io.StringIO()
    context = MigrationContext.configure(
        dialect_name="mssql", opts={"as_sql": True, "output_buffer": output}
    )
    with Operations.context(context):
        _migration().upgrade()
        _migration().downgrade()
    statements = [part.strip() for part in output.getvalue().split("GO") if part.strip()]
    assert statements == [
        "IF OBJECT_ID(N'[OutboxDelivery]', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE [OutboxDelivery] (\n"
        "    [Destination] NVARCHAR(200) NOT NULL, \n"
        "    [MessageId] NVARCHAR(200) NOT NULL, \n"
        "    [OutboxRecordId] NVARCHAR(200) NOT NULL, \n"
        "    [DeliveredAt] DATETIME NOT NULL, \n"
        "    CONSTRAINT [pk_OutboxDelivery] PRIMARY KEY ([Destination], [MessageId])\n"
        ")\nEND;",
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'ix_OutboxDelivery_DeliveredAt' "
        "AND object_id = OBJECT_ID(N'[OutboxDelivery]'))\n"
        "CREATE INDEX [ix_OutboxDelivery_DeliveredAt] ON [OutboxDelivery] ([DeliveredAt]);",
        "DROP TABLE [OutboxDelivery];",
    ]


def test_the_revision_creates_what_the_model_declares_and_is_idempotent(database):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    module = _migration()
    assert (module.revision, module.down_revision) == (
        "0007_outbox_delivery",
        "0006_spark_send_ledger",
    )
    _run_migration(database.engine, "upgrade")
    _run_migration(database.engine, "upgrade")  # again: nothing to do, no error
    with database.engine.connect() as connection:
        diffs = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert [diff for diff in diffs if "OutboxDelivery" in repr(diff)] == []
    inspector = sa.inspect(database.engine)
    assert [column["name"] for column in inspector.get_columns("OutboxDelivery")] == (
        DELIVERY_COLUMNS
    )
    assert inspector.get_pk_constraint("OutboxDelivery")["constrained_columns"] == [
        "Destination",
        "MessageId",
    ]
    _run_migration(database.engine, "downgrade")
    assert not sa.inspect(database.engine).has_table("OutboxDelivery")


def test_long_keys_are_shortened_apart():
    assert delivery_key("billing") == "billing"
    first, second = "q" * 250 + "1", "q" * 250 + "2"
    assert len(delivery_key(first)) == 200 and delivery_key(first) != delivery_key(second)
    assert delivery_key(first) == delivery_key(first)


# -- the check ----------------------------------------------------------------------------
@only("sqlite", "postgresql")
def test_a_crash_between_the_commits_does_not_send_again(database, app, remote):
    outbox = Outbox(app, Routing({"ledger": remote.engine.url.render_as_string(False)}))
    _store(
        database.engine,
        outbox,
        [
            ("r1", [_operation("ledger", "l1"), _operation("billing", "b1")]),
            ("r2", [_operation("ledger", "l2"), _operation("ledger", "l3")]),
        ],
    )
    fault = _FailTheMark(database.engine)
    with pytest.raises(RuntimeError, match="between the two commits"):
        outbox.dispatch_due(grace_period=0)
    fault.remove()
    # The destination committed; here the mark and the local send rolled back.
    assert sorted(queue_message_ids(remote.engine, "ledger")) == ["l1", "l2", "l3"]
    assert queue_message_ids(database.engine, "billing") == []
    assert [row[1] for row in outbox_rows(database.engine)] == [False, False]

    report = outbox.dispatch_due(grace_period=0)
    assert (report.dispatched, report.already_delivered) == (2, 3)
    assert dict(report.messages) == {"billing": 1}
    assert "3 message(s) already delivered, not sent again" in report.describe()
    assert sorted(queue_message_ids(remote.engine, "ledger")) == ["l1", "l2", "l3"]
    assert queue_message_ids(database.engine, "billing") == ["b1"]
    assert _deliveries(remote.engine) == [
        ("ledger", "l1", "r1"),
        ("ledger", "l2", "r2"),
        ("ledger", "l3", "r2"),
    ]
    assert all(row[1] for row in outbox_rows(database.engine))
    outbox.close()


@only("sqlite", "postgresql")
def test_the_inline_dispatch_skips_what_was_delivered(database, app, remote):
    outbox = Outbox(app, Routing({"ledger": remote.engine.url.render_as_string(False)}))
    _store(database.engine, outbox, [("r1", [_operation("ledger", "l1")])])
    fault = _FailTheMark(database.engine)
    with pytest.raises(RuntimeError):
        outbox.dispatch("r1")
    fault.remove()
    assert outbox.dispatch("r1") == 0  # nothing sent: it was there already
    assert queue_message_ids(remote.engine, "ledger") == ["l1"]
    assert outbox.dispatch("r1") is None  # dispatched now
    outbox.close()


@only("sqlite", "postgresql")
def test_one_message_id_sent_twice_to_a_queue_arrives_once(database, app, remote, caplog):
    outbox = Outbox(app, Routing({"ledger": remote.engine.url.render_as_string(False)}))
    _store(
        database.engine,
        outbox,
        [
            ("r1", [_operation("ledger", "same"), _operation("ledger", "same")]),
            ("r2", [_operation("ledger", "same"), _operation("ledger", "other")]),
        ],
    )
    with caplog.at_level(logging.INFO, logger="sqlqueue_orm.sending"):
        report = outbox.dispatch_due(grace_period=0)
    assert (report.dispatched, report.already_delivered, dict(report.messages)) == (
        2,
        2,
        {"ledger": 2},
    )
    assert sorted(queue_message_ids(remote.engine, "ledger")) == ["other", "same"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("message same of outbox record r2" in text and "ledger" in text for text in warnings)
    outbox.close()


@only("sqlite", "postgresql")
def test_same_database_sends_leave_no_delivery_rows(database, app):
    outbox = Outbox(app)
    _store(database.engine, outbox, [("r1", [_operation("billing", "b1")])])
    assert outbox.dispatch_due(grace_period=0).dispatched == 1
    assert queue_message_ids(database.engine, "billing") == ["b1"]
    assert not sa.inspect(database.engine).has_table("OutboxDelivery")


# -- cleanup ------------------------------------------------------------------------------
def _delivery_rows(engine, rows):
    outbox_delivery_table().create(engine, checkfirst=True)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(outbox_delivery_table()),
            [
                {"Destination": "q", "MessageId": key, "OutboxRecordId": key, "DeliveredAt": at}
                for key, at in rows
            ],
        )


@only("sqlite", "postgresql")
def test_cleanup_deletes_old_delivery_rows_here_and_in_routed_databases(database, app, remote):
    now = utc_now()
    old, recent = now - dt.timedelta(days=8), now - dt.timedelta(days=6)
    _delivery_rows(database.engine, [(f"here-{n}", old) for n in range(3)] + [("here-new", recent)])
    _delivery_rows(remote.engine, [(f"there-{n}", old) for n in range(4)] + [("there-new", recent)])
    url = remote.engine.url.render_as_string(False)
    outbox = Outbox(app, Routing({"ledger": url, "ledger2": url}))  # one database, cleaned once
    with database.engine.begin() as connection:
        outbox.store(connection, "old-record", [], dispatched=True, now=old)
    assert outbox.cleanup(dt.timedelta(days=7), batch_size=2) == 1
    assert [row[1] for row in _deliveries(database.engine)] == ["here-new"]
    assert [row[1] for row in _deliveries(remote.engine)] == ["there-new"]
    assert outbox_rows(database.engine) == []
    assert outbox.cleanup_deliveries(dt.timedelta(days=5)) == 2
    outbox.close()


@only("sqlite", "postgresql")
def test_cleanup_skips_databases_without_the_table(database, app, remote):
    outbox = Outbox(app, Routing({"ledger": remote.engine.url.render_as_string(False)}))
    assert outbox.cleanup_deliveries(dt.timedelta(0)) == 0
    outbox.close()


@only("sqlite", "postgresql")
def test_cleanup_command_with_routes(database, app, remote, tmp_path):
    _delivery_rows(remote.engine, [("old", utc_now() - dt.timedelta(days=2))])
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"ledger": remote.engine.url.render_as_string(False)}))
    result = subprocess.run(
        [*sqlqueue_command(), "--url", database.url, "outbox", "cleanup", "--older-than", "1d",
         "--routes", str(routes)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "deleted 0 dispatched outbox record(s) older than 1d",
        "deleted 1 outbox delivery row(s) older than 1d",
    ]
    assert _deliveries(remote.engine) == []


def test_delivery_cleanup_statements():
    assert str(outbox_statements.delivery_cleanup_statement(mssql.dialect())) == (
        "DELETE TOP (:batch_size) FROM [OutboxDelivery] WITH (ROWLOCK, READPAST) "
        "WHERE [DeliveredAt] < :cutoff OPTION (MAXDOP 1)"
    )
    dialect = postgresql.dialect()
    text = str(outbox_statements.delivery_cleanup_statement(dialect).compile(dialect=dialect))
    assert text.startswith('DELETE FROM "OutboxDelivery" WHERE ("OutboxDelivery"."Destination", ')
    assert text.endswith("FOR UPDATE SKIP LOCKED)")


# -- killed at random ---------------------------------------------------------------------
RECORDS = 5000


def _load(engine, outbox):
    """RECORDS records: each sends one message to ``ledger`` there, every 4th one to billing."""
    with engine.begin() as connection:
        outbox.store_many(
            connection,
            (
                (
                    f"r-{n}",
                    [_operation("ledger", f"l-{n}", b"%d" % n)]
                    + ([_operation("billing", f"b-{n}")] if n % 4 == 0 else []),
                )
                for n in range(RECORDS)
            ),
        )


def _wait_for_dead_sessions(database, remote_url):
    """PostgreSQL: until the backends of killed dispatchers have rolled back and gone."""
    if database.dialect != "postgresql":
        return
    names = [database.engine.url.database, sa.make_url(remote_url).database]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with database.engine.connect() as connection:
            busy = connection.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(:names) "
                    "AND pid <> pg_backend_pid() AND state <> 'idle'"
                ),
                {"names": names},
            ).scalar_one()
        if not busy:
            return
        time.sleep(0.1)


def _kill_repeatedly(database, remote_url, kills, plans, legacy=False):
    """Run dispatcher processes until *kills* of them died by SIGKILL; return the plans used."""
    rng = random.Random(f"{database.dialect}-{kills}-{legacy}")
    used = []
    for attempt in range(kills * 3):
        if len(used) == kills:
            break
        kind = plans[attempt % len(plans)]
        # Short timers: on a quiet machine a 0.2 s dispatcher could drain the whole outbox and
        # leave the later kill points nothing to reach.
        plan = f"timer:{rng.uniform(0.0, 0.05):.3f}" if kind == "timer" else (
            f"{kind}:{rng.randint(1, 4)}"
        )
        batch = rng.choice([1, 5, 20])
        args = [
            sys.executable, "-m", "testsupport.outbox_app", "dispatch", database.url, remote_url
        ]
        child = subprocess.run(
            [*args, plan, str(batch), *(["legacy"] if legacy else [])],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        if child.returncode == -signal.SIGKILL:
            used.append(plan)
        else:
            # Only a timer can outlast the work it had; anything else is a failure.
            assert child.returncode == 0 and kind == "timer", child.stderr
        _wait_for_dead_sessions(database, remote_url)
    assert len(used) == kills, f"only {len(used)} of {kills} dispatchers were killed"
    return used


def _final_run(database, remote_url, tmp_path):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"ledger": remote_url}))
    result = subprocess.run(
        [*sqlqueue_command(), "--url", database.url, "outbox", "dispatch", "--once",
         "--grace-period", "0", "--retry-delay", "0", "--routes", str(routes)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
@pytest.mark.timeout(480)  # dozens of dispatcher processes, each started and killed
@only("sqlite", "postgresql")
def test_dispatchers_killed_at_random_deliver_every_message_exactly_once(
    database, app, remote, remote_url, tmp_path
):
    outbox = Outbox(app)
    _load(database.engine, outbox)
    plans = _kill_repeatedly(database, remote_url, 24, ["between", "inside", "timer"])
    assert sum(plan.startswith("between") for plan in plans) >= 8
    _final_run(database, remote_url, tmp_path)

    ledger = collections.Counter(queue_message_ids(remote.engine, "ledger"))
    billing = collections.Counter(queue_message_ids(database.engine, "billing"))
    assert [key for key, copies in ledger.items() if copies > 1] == []
    assert [key for key, copies in billing.items() if copies > 1] == []
    assert set(ledger) == {f"l-{n}" for n in range(RECORDS)}  # none lost
    assert set(billing) == {f"b-{n}" for n in range(0, RECORDS, 4)}
    assert all(row[1] for row in outbox_rows(database.engine))
    assert len(_deliveries(remote.engine)) == RECORDS


@pytest.mark.slow
@only("sqlite", "postgresql")
def test_without_the_delivery_check_the_same_kills_double_messages(
    database, app, remote, remote_url, tmp_path
):
    outbox = Outbox(app)
    _load(database.engine, outbox)
    _kill_repeatedly(database, remote_url, 4, ["between"], legacy=True)
    _final_run(database, remote_url, tmp_path)
    ledger = collections.Counter(queue_message_ids(remote.engine, "ledger"))
    assert set(ledger) == {f"l-{n}" for n in range(RECORDS)}
    assert sum(copies - 1 for copies in ledger.values()) >= 4  # each kill left at least one
