"""Peek costs the same at any queue length: it reads the ends of the RowVersion index only."""

from __future__ import annotations

from sqlqueue_orm import OutgoingMessage
from tests.conftest import only


@only("sqlite")
def test_sqlite_peek_reads_the_ends_of_the_rowid_not_the_table(database):
    transport = database.transport()
    transport.create_queue("deep")
    transport.send_many("deep", [OutgoingMessage(b"x") for _ in range(50)])
    statement = transport.queues.table_queue("deep")._peek.text
    with database.engine.connect() as connection:
        plan = [row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}")]
    assert plan, statement
    scans = [step for step in plan if step.startswith("SCAN") and "CONSTANT ROW" not in step]
    assert not scans, plan
    assert transport.peek("deep") == 50
