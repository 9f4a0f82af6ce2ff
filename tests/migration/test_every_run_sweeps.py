"""Every online upgrade sweeps every queue table, also when the database is already at head.

Issue 10, defect 5: a legacy table that appeared after the queue steps ran (a .NET v1 endpoint's
new queue, a restored database) used to stay legacy forever, and the run said nothing. Now the
next `sqlqueue migrate` or `alembic upgrade head` upgrades it, keeps every message in FIFO
order, and says per table what it did.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Connection

from sqlqueue_orm import Transport, cli
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.migration import environment, steps
from sqlqueue_orm.models.queue_table import build_queue_table
from tests.conftest import only
from tests.migration import shapes
from testsupport import legacy

CURRENT = "current orders"
LATE_V1 = "late v1-endpoint q.x"
LATE_2_2_2 = "restored 2.2.2 q.y"


def _create_legacy(connection: Connection, era: str, table: str, seed: int) -> list[Any]:
    legacy.create(connection, era, table, None)
    legacy.insert(connection, table, None, legacy.messages(300, seed=seed))
    names = legacy.Names(connection.dialect, table, None)
    row_version = names.quote("RowVersion")
    # Gaps, and the newest rows gone: RowVersion must still never go back.
    connection.exec_driver_sql(
        f"DELETE FROM {names.qualified} WHERE {row_version} % 7 = 0 OR {row_version} > 297",
        execution_options={"no_parameters": True},
    )
    return legacy.snapshot(connection, table, None)


def _layout(shape: dict[str, Any]) -> dict[str, Any]:
    """A shape without index names (they carry the table name on PostgreSQL and SQLite)."""
    return {
        **{key: value for key, value in shape.items() if key != "indexes"},
        "indexes": sorted(repr(index) for index in shape["indexes"].values()),
    }


def _assert_current(connection: Connection, table: str, from_legacy: bool = True) -> None:
    twin = f"twin of {table}"
    build_queue_table(sa.MetaData(), twin, None, connection.dialect).create(connection)
    try:
        upgraded = _layout(shapes.describe(connection, table, None))
        expected = shapes.describe(connection, twin, None)
        if connection.dialect.name == "postgresql" and from_legacy:
            # Legacy rows carry CorrelationIds, so revision 0008 keeps that column (correlationid).
            expected = shapes.with_kept_correlation_id(expected)
        assert upgraded == _layout(expected), table
    finally:
        connection.exec_driver_sql(
            f"DROP TABLE {legacy.Names(connection.dialect, twin, None).qualified}"
        )


def _assert_fifo(database: Any, table: str, before: list[Any]) -> None:
    with Transport(database.engine) as transport:
        newest = transport.send(table, OutgoingMessage(b"after the upgrade"))
        received = []
        while batch := transport.receive(table, max_messages=50):
            received += batch
    assert [m.id for m in received[:-1]] == [uuid.UUID(str(row[0])) for row in before]
    assert [m.row_version for m in received[:-1]] == [row[-1] for row in before]
    assert [m.body for m in received[:-1]] == [
        None if row[-2] is None else bytes(row[-2]) for row in before
    ]
    assert received[-1].message_id == newest
    assert received[-1].row_version > max(row[-1] for row in before)


def _summary(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """The sweep's lines: ``{table: what was done}``."""
    lines = {}
    for record in caplog.records:
        if record.name == "sqlqueue_orm.migration.operations":
            message = record.getMessage()
            for table in (CURRENT, LATE_V1, LATE_2_2_2):
                prefix = f"queue {QueueAddress(table)}: "
                said = message.removeprefix(prefix)
                if message.startswith(prefix) and (
                    said == "already current" or said.startswith("upgraded: ")
                ):
                    assert table not in lines, f"two summary lines for {table}"
                    lines[table] = said
    caplog.clear()
    return lines


@only("sqlite", "postgresql")
def test_a_legacy_table_that_appears_after_head_is_upgraded_by_the_next_run(
    database: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqlqueue_orm.migration")
    with database.engine.begin() as connection:
        build_queue_table(sa.MetaData(), CURRENT, None, connection.dialect).create(connection)
    assert cli.main(["--url", database.url, "migrate"]) == 0  # the database is at head now
    first = _summary(caplog)

    # A .NET v1 endpoint creates its queue later; `sqlqueue migrate` at head upgrades it.
    with database.engine.begin() as connection:
        before_v1 = _create_legacy(connection, "v1", LATE_V1, seed=1)
    assert cli.main(["--url", database.url, "migrate"]) == 0
    second = _summary(caplog)

    # A restored 2.2.2-era table; `alembic upgrade head` (already at head) upgrades it too.
    with database.engine.begin() as connection:
        before_2_2_2 = _create_legacy(connection, "2.2.2", LATE_2_2_2, seed=2)
    command.upgrade(environment.alembic_config(database.url), "head")
    third = _summary(caplog)

    with database.engine.begin() as connection:
        for table in (CURRENT, LATE_V1, LATE_2_2_2):
            _assert_current(connection, table, from_legacy=table != CURRENT)
        assert legacy.snapshot(connection, LATE_V1, None) == before_v1
        assert legacy.snapshot(connection, LATE_2_2_2, None) == before_2_2_2
    _assert_fifo(database, LATE_V1, before_v1)
    _assert_fifo(database, LATE_2_2_2, before_2_2_2)

    # One line per table and run, saying what was done. 0001 builds the Expires index filtered
    # at once, so 0003 finds nothing to do on a v1 table (docs/migrations.md).
    # On PostgreSQL, 0008 then moves each legacy table to NServiceBus's PostgreSQL layout, and
    # 0011 gives it the storage settings.
    dialect = database.engine.dialect.name
    nsb = ", 0008_postgresql_nsb_layout, 0011_queue_storage" if dialect == "postgresql" else ""
    assert first == {CURRENT: "already current"}
    assert second == {
        CURRENT: "already current",
        LATE_V1: "upgraded: 0001_expires_index, 0002_headers_nvarchar, 0004_rowversion_layout"
        + nsb,
    }
    assert third == {
        CURRENT: "already current",
        LATE_V1: "already current",
        LATE_2_2_2: "upgraded: "
        + ", ".join(
            rev
            for rev in steps.STEPS
            if rev != "0001_expires_index" and steps.applies_to(rev, dialect)
        ),
    }


@only("sqlite")
def test_a_table_the_sweep_cannot_upgrade_does_not_hold_back_the_others(
    database: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="sqlqueue_orm.migration")
    assert cli.main(["--url", database.url, "migrate"]) == 0
    checked = "a checked v1 q"  # sorts first
    with database.engine.begin() as connection:
        names = legacy.Names(connection.dialect, checked, None)
        # A CHECK constraint, which SQLite's table rebuild would not keep: refused by name.
        ddl = legacy.BUILDERS[("v1", "sqlite")](names)[0]
        connection.exec_driver_sql(ddl[:-1] + ", CHECK (\"Id\" <> ''))")
        before = _create_legacy(connection, "v1", LATE_V1, seed=3)
    caplog.clear()

    assert cli.main(["--url", database.url, "migrate"]) == 2
    assert checked in capsys.readouterr().err
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"queue {QueueAddress(checked)}: not upgraded")
    with database.engine.begin() as connection:
        _assert_current(connection, LATE_V1)
        assert legacy.snapshot(connection, LATE_V1, None) == before
