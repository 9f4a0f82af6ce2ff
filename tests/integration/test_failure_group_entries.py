"""An endpoint writes the failure-group entry of each message it moves to the error queue.

The entry commits with the move (failed messages and poison rows alike, in each transaction
mode) and is the one a listing would compute, so a listing then fingerprints nothing; without
the table, or when writing the entry fails, the move still commits and the next listing
catches up. A listing that finds every row paired with an entry reads no ids, yet one row gone
and another come (the counts unchanged) are still seen.
"""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, headers
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.models import failure_keys
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.recoverability import ErrorQueue
from sqlqueue_orm.recoverability.groups import TABLE, FailureGroups, entry
from tests.integration.test_endpoint_transaction_modes import run_until
from tests.integration.test_error_and_audit_queues import insert_raw

MODES = [TransactionMode.TRANSACTION_SCOPE, TransactionMode.NONE]


def settings(mode: TransactionMode, **changes: object) -> EndpointSettings:
    values: dict[str, object] = {"concurrency": 1, "transaction_mode": mode, "peek_delay": 0.1,
                                 "immediate_retries": 0, "delayed_retries": 0, **changes}
    return EndpointSettings(**values)  # type: ignore[arg-type]


def failing_endpoint(transport, mode, **changes):  # type: ignore[no-untyped-def]
    endpoint = Endpoint("inbox", transport, settings=settings(mode, **changes))

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        raise ValueError(f"order {body!r} rejected")

    return endpoint


def moved(endpoint: Endpoint, count: int):  # type: ignore[no-untyped-def]
    return lambda: endpoint.stats.failed + endpoint.stats.poison >= count


def stored_entries(database) -> dict[uuid.UUID, dict[str, object]]:  # type: ignore[no-untyped-def]
    with database.engine.connect() as connection:
        if not sa.inspect(connection).has_table(TABLE.name):
            return {}
        rows = connection.execute(sa.select(TABLE)).mappings().all()
    return {uuid.UUID(str(row["id"])): dict(row) for row in rows}


def computed_entries(transport) -> dict[uuid.UUID, dict[str, object]]:  # type: ignore[no-untyped-def]
    """The entries a listing would write for the error queue's rows."""
    errors = ErrorQueue(transport)
    with transport.engine.connect() as connection:
        rows = connection.execute(errors.select_messages(body=False)).all()
    found = {}
    for row in rows:
        message = errors.message_of(row)
        found[message.id] = entry(str(errors.address), message)
    return found


def same(stored: dict[str, object], computed: dict[str, object]) -> bool:
    normal = {**stored, "id": uuid.UUID(str(stored["id"]))}
    if isinstance(normal["failed_at"], str):  # SQLite
        normal["failed_at"] = computed["failed_at"] and computed["failed_at"].isoformat(" ")
        return normal == {**computed, "failed_at": normal["failed_at"]} and (
            str(stored["failed_at"])[:19] == str(computed["failed_at"])[:19])
    return normal == computed


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_the_entry_commits_with_the_move_as_a_listing_would_write_it(database, mode):
    transport = database.transport()
    transport.create_queues(["inbox", "error"])
    for number in range(3):
        transport.send("inbox", OutgoingMessage(f"{number}".encode(), message_id=f"m{number}"))
    poison = uuid.uuid4()
    insert_raw(database, "inbox", poison, "{not json", b"poison")
    endpoint = failing_endpoint(transport, mode)
    run_until(endpoint, moved(endpoint, 4))

    stored = stored_entries(database)
    computed = computed_entries(transport)
    assert len(computed) == 4 and set(stored) == set(computed)  # before any listing
    for native_id, values in computed.items():
        assert same(stored[native_id], values), (stored[native_id], values)
    assert stored[poison]["stack_label"] == "(headers cannot be read)"
    groups = FailureGroups(ErrorQueue(transport))
    assert groups.refresh() == 0  # nothing left to fingerprint
    assert sorted(g.count for g in groups.list()) == [1, 3]


def test_without_the_table_or_when_the_entry_fails_the_move_commits(database):
    transport = database.transport()
    transport.create_queues(["inbox", "error"])
    # Not created at start-up (create_queues off): the moves write no entry...
    transport.send("inbox", OutgoingMessage(b"1", message_id="before"))
    endpoint = failing_endpoint(transport, TransactionMode.TRANSACTION_SCOPE,
                                create_queues=False, delayed_delivery=False)
    run_until(endpoint, moved(endpoint, 1))
    assert [m.message_id for m in ErrorQueue(transport).list()] == ["before"]
    assert stored_entries(database) == {}
    # ...and a listing fingerprints them (making the table).
    groups = FailureGroups(ErrorQueue(transport))
    assert [g.count for g in groups.list()] == [1]

    # The table gone after this process made it: the entry's insert fails, the move commits.
    with database.engine.begin() as connection:
        TABLE.drop(connection)
    transport.send("inbox", OutgoingMessage(b"2", message_id="after"))
    endpoint = failing_endpoint(transport, TransactionMode.TRANSACTION_SCOPE,
                                create_queues=False, delayed_delivery=False)
    run_until(endpoint, moved(endpoint, 1))
    assert sorted(m.message_id for m in ErrorQueue(transport).list()) == ["after", "before"]
    failure_keys._created.clear()  # forget the table this process made
    assert [g.count for g in groups.list()] == [2]


def test_an_unchanged_queue_reads_no_ids_and_a_swap_is_seen(database):
    transport = database.transport()
    transport.create_queues(["error"])
    for number in range(3):
        transport.send("error", OutgoingMessage(b"x", message_id=f"m{number}", headers={
            headers.EXCEPTION_TYPE: "builtins.KeyError",
            headers.PROCESSING_ENDPOINT: "inbox"}))
    groups = FailureGroups(ErrorQueue(transport))
    assert [g.count for g in groups.list()] == [3]
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    sa.event.listen(database.engine, "before_cursor_execute", seen)
    try:
        assert [g.count for g in groups.list()] == [3]
        assert len(statements) == 2, statements  # the pairs counted, then the groups
        # One row gone, one written by another tool: the counts are as before.
        errors = ErrorQueue(transport)
        errors.delete([errors.list()[0].id])
        found = {headers.MESSAGE_ID: "dotnet", headers.EXCEPTION_TYPE: "System.Exception",
                 headers.PROCESSING_ENDPOINT: "Billing"}
        with transport.engine.begin() as connection:
            transport.queues.table_queue("error").send(connection, [PreparedMessage(
                uuid.uuid4(), "dotnet", json.dumps(found), b"", None)])
    finally:
        sa.event.remove(database.engine, "before_cursor_execute", seen)
    assert sorted((g.label, g.count) for g in groups.list("endpoint")) == [
        ("Billing", 1), ("inbox", 2)]
