"""``sqlqueue outbox dispatch --once``: a queue no route names is said to be not routed (not
"create it", which would deliver into the wrong database), ``--once`` exits 1 while records wait
for a retry, and a database without ``OutboxData`` is told to migrate once."""

from __future__ import annotations

import json

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.models.outbox import outbox_table
from sqlqueue_orm.sending.outbox import OutboxOperation
from tests.conftest import only
from tests.integration.cli_process import one_line, sqlqueue
from testsupport.outbox_app import install


@only("sqlite", "postgresql")
def test_a_queue_no_route_names_is_not_routed_and_once_exits_1(database, tmp_path):
    transport = database.transport()
    outbox = install(transport, "billing")
    with database.engine.begin() as connection:
        for record_id, queue in (("good", "billing"), ("elsewhere", "ledger")):
            operation = OutboxOperation.from_prepared(
                queue, OutgoingMessage(b"x", message_id=record_id).prepare()
            )
            outbox.store(connection, record_id, [operation])
    once = ("--url", database.url, "outbox", "dispatch", "--once", "--grace-period", "0")
    result = sqlqueue(*once, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "dispatched 1 record(s), 1 message(s) (billing: 1); deferred 1 record(s)" in (
        result.stdout
    )
    assert "queue ledger is not routed to another database" in result.stderr
    assert "--routes FILE" in result.stderr
    assert "create_queue()" not in result.stderr and "create-queue" not in result.stderr
    assert "1 outbox record(s) not dispatched" in result.stderr
    # Run again at once, still without the route: tried again (a dispatcher that routes it
    # would send it), deferred again; --once still says so.
    again = sqlqueue(*once, cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert "dispatched 0 record(s), 0 message(s); deferred 1 record(s)" in again.stdout
    assert "ledger" not in dict(transport.list_queues())


@only("sqlite", "postgresql")
def test_once_exits_0_when_nothing_waits(database, tmp_path):
    install(database.transport(), "billing")
    result = sqlqueue("--url", database.url, "outbox", "dispatch", "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "dispatched 0 record(s), 0 message(s); deferred 0 record(s)"


@only("sqlite", "postgresql")
def test_a_database_without_outbox_data_is_told_to_migrate_once(database, tmp_path):
    result = sqlqueue("--url", database.url, "outbox", "dispatch", "--once", cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("sqlqueue: error: table 'OutboxData' is outdated: it does not exist")
    assert line.count("sqlqueue migrate") == 1, line
    assert line.count("Outbox.create_table()") == 1, line


@only("sqlite", "postgresql")
def test_records_deferred_for_a_missing_route_go_at_once_when_a_dispatcher_has_it(
    database, tmp_path
):
    transport = database.transport()
    outbox = install(transport, "billing")
    with database.engine.begin() as connection:
        for number in range(5):
            operation = OutboxOperation.from_prepared(
                "ledger", OutgoingMessage(b"x", message_id=f"l{number}").prepare()
            )
            outbox.store(connection, f"r{number}", [operation])
        operation = OutboxOperation.from_prepared(
            "down", OutgoingMessage(b"x", message_id="d0").prepare()
        )
        outbox.store(connection, "to-down", [operation])
    once = ("--url", database.url, "outbox", "dispatch", "--once", "--grace-period", "0")
    unrouted = sqlqueue(*once, cwd=tmp_path)
    assert unrouted.returncode == 1, unrouted.stderr
    assert "deferred 6 record(s)" in unrouted.stdout

    ledger = Transport(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_queue("ledger")
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({
        "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
        "down": f"sqlite:///{tmp_path / 'no such folder' / 'down.db'}",  # cannot be reached
    }))
    routed = sqlqueue(*once, "--retry-delay", "30", "--routes", str(routes), cwd=tmp_path)
    assert routed.returncode == 1, routed.stderr  # the record for "down" failed for real
    # (The batch's sends to ledger committed there before "down" failed: the record-by-record
    # pass finds them delivered and marks the records without sending again.)
    assert "dispatched 5 record(s)" in routed.stdout
    assert "deferred 1 record(s)" in routed.stdout
    assert sorted(message.message_id for message in ledger.receive("ledger", 10)) == [
        f"l{number}" for number in range(5)
    ]
    # A real send failure keeps its back-off: not tried again before the retry delay.
    again = sqlqueue(*once, "--routes", str(routes), cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert "deferred 0 record(s); 1 record(s) deferred by an earlier pass still wait" in (
        again.stdout
    )
    assert ledger.receive("ledger", 10) == []  # nothing sent twice
    ledger.close()


@only("sqlite", "postgresql")
def test_once_counts_the_records_it_skips_for_want_of_a_route_with_those_deferred_earlier(
    database, tmp_path
):
    """A record no route names stays due in the table and the dispatcher skips it in memory;
    ``--once`` counts it with the records an earlier pass deferred in the table, none hidden."""
    transport = database.transport()
    outbox = install(transport, "billing")
    with database.engine.begin() as connection:
        operation = OutboxOperation.from_prepared(
            "billing", OutgoingMessage(b"x", message_id="unreadable").prepare()
        )
        outbox.store(connection, "unreadable", [operation])
        table = outbox_table()
        connection.execute(
            table.update().where(table.c.MessageId == "unreadable").values(Operations="[{")
        )
    once = ("--url", database.url, "outbox", "dispatch", "--once", "--grace-period", "0",
            "--retry-delay", "3600")
    first = sqlqueue(*once, cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    assert "deferred 1 record(s) (they failed" in first.stdout  # in the table, for an hour
    with database.engine.begin() as connection:
        operation = OutboxOperation.from_prepared(
            "ledger", OutgoingMessage(b"x", message_id="elsewhere").prepare()
        )
        outbox.store(connection, "elsewhere", [operation])
    second = sqlqueue(*once, cwd=tmp_path)
    assert second.returncode == 1, second.stderr
    assert "queue ledger is not routed to another database" in second.stderr
    assert "deferred 1 record(s) (they failed" in second.stdout  # skipped in memory
    assert "1 record(s) deferred by an earlier pass still wait for a retry" in second.stdout
    assert "2 outbox record(s) not dispatched" in second.stderr
