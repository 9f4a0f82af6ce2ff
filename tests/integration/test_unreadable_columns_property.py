"""Property test: whatever SQLite holds in a queue row's columns, no message is lost or blocked.

Arbitrary values of every storage class (NULL, INTEGER from huge negative to huge, REAL, TEXT
empty or any Unicode, BLOB) go into every column of one row, written straight into the table
between two good messages. On every path each row comes out exactly once, or stays: a receive
without a connection, one in a caller's transaction (and after its rollback), a browse, a peek,
an endpoint (the good messages handled, the odd row handled or in the error queue) and the
command line (one line per row).
"""

from __future__ import annotations

import os
import subprocess
import sys

import sqlalchemy as sa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.receiving import Endpoint, EndpointSettings
from tests.conftest import only
from tests.integration.test_endpoint_transaction_modes import run_until

COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "Headers", "Body")

stored_values = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 5, 12345, 10**18]),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.sampled_from(["", " ", "not-a-uuid", "2000-01-01 00:00:00.000", "2999-01-01", "{}", "[]"]),
    st.binary(max_size=40),
)
rows = st.fixed_dictionaries({column: stored_values for column in COLUMNS})
EXAMPLES = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fill(database, queue, row):  # type: ignore[no-untyped-def]
    """Empty *queue*, then a good message, *row* as given, a good message: the good ids.

    One transport for all the examples of a test (each would keep connections of its own).
    """
    transport = getattr(database, "odd_rows_transport", None)
    if transport is None:
        transport = database.odd_rows_transport = database.transport()
    transport.create_queue(queue)
    transport.purge_all(queue)
    first = transport.send(queue, OutgoingMessage(b"first"))
    table = sa.table(queue, *(sa.column(name) for name in COLUMNS))
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.insert(table).values(row))
    except sa.exc.IntegrityError:  # NULL in a NOT NULL column: SQLite refuses the row
        assume(False)
    last = transport.send(queue, OutgoingMessage(b"last"))
    return transport, first, last


def assert_three_in_order(messages, first, last):  # type: ignore[no-untyped-def]
    assert len(messages) == 3
    assert [messages[0].message_id, messages[2].message_id] == [first, last]
    assert [messages[0].body, messages[2].body] == [b"first", b"last"]
    assert messages[0].row_version < messages[1].row_version < messages[2].row_version


@only("sqlite")
@given(row=rows, in_transaction=st.booleans())
@settings(EXAMPLES, max_examples=60)
def test_receive_browse_and_peek_hand_out_every_row_once(database, row, in_transaction):
    transport, first, last = fill(database, "odd", row)
    assert_three_in_order(transport.browse("odd", 10), first, last)
    assert transport.peek("odd") == 3
    try:  # taken in a transaction that rolls back: every row stays
        with database.engine.begin() as connection:
            assert_three_in_order(transport.receive("odd", 10, connection=connection), first, last)
            raise LookupError
    except LookupError:
        pass
    assert_three_in_order(transport.browse("odd", 10), first, last)
    if in_transaction:
        with database.engine.begin() as connection:
            messages = transport.receive("odd", 10, connection=connection)
    else:
        messages = transport.receive("odd", 10)
    assert_three_in_order(messages, first, last)
    odd = messages[1]
    if odd.stored_values is not None:
        assert odd.headers_error is not None
        assert all(column in odd.headers_error for column in odd.stored_values)
    assert transport.receive("odd", 10) == []
    assert transport.peek("odd") == 0


@only("sqlite")
@given(row=rows)
@settings(EXAMPLES, max_examples=6)
def test_an_endpoint_and_the_command_line_hand_out_every_row_once(database, row):
    transport, first, last = fill(database, "inbox", row)
    transport.create_queue("error")
    transport.purge_all("error")
    env = {**os.environ, "SQLQUEUE_URL": database.url}

    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "sqlqueue_orm.cli", *args], capture_output=True, text=True,
            env=env, timeout=120, check=False,
        )
        assert result.returncode == 0 and result.stderr == "", result.stderr
        return result.stdout

    assert cli("browse", "inbox", "--count", "10").count("\n") == 3
    handled: list[str] = []
    endpoint = Endpoint("inbox", transport, settings=EndpointSettings(concurrency=1,
                                                                       peek_delay=0.1))
    endpoint.handle_raw(lambda body, context: handled.append(context.message_id))

    def done() -> bool:
        stats = endpoint.stats
        return stats.handled + stats.failed + stats.expired + stats.poison >= 3

    run_until(endpoint, done)
    assert handled[0] == first and handled[-1] == last
    stats = endpoint.stats
    moved = cli("receive", "error", "--count", "10")
    assert stats.handled == len(handled) and stats.handled + stats.expired + moved.count("\n") == 3
    assert stats.poison + stats.failed == moved.count("\n")
    assert transport.peek("inbox") == 0
