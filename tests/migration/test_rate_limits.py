"""Revision 0012_rate_limits: the rate limits' schedule table, declared once, made by Alembic.

`sqlqueue migrate` creates ``sqlqueue_rate_limits`` as :class:`RateLimitSchedule` declares it
(autogenerate finds no difference); a table an endpoint created at start-up before the revision
existed (the DDL that version emitted) is kept with its rows, and `sqlqueue verify` accepts it;
verify finds a drifted schedule table and its repair fixes it; the downgrade drops the table.
The offline T-SQL is checked in tests/tsql/test_flow_control.py.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from sqlqueue_orm import cli, verify
from sqlqueue_orm.migration import environment
from sqlqueue_orm.models.base import Base
from sqlqueue_orm.models.rate_limit import TABLE_NAME, RateLimitSchedule
from sqlqueue_orm.receiving.flow import rate_limit
from tests.conftest import Database, only
from tests.migration import declared


def _schedules(database: Database) -> list[tuple[str, float]]:
    with database.engine.connect() as connection:
        return [(row.name, row.next_at) for row in connection.execute(
            sa.select(rate_limit.RATE_TABLE.c.name, rate_limit.RATE_TABLE.c.next_at))]


def test_the_table_is_declared_once():
    assert Base.metadata.tables[TABLE_NAME] is RateLimitSchedule.__table__
    assert rate_limit.RATE_TABLE is RateLimitSchedule.__table__


def test_migrate_creates_the_declared_table_and_downgrade_drops_it(database: Database) -> None:
    assert cli.main(["--url", database.url, "migrate"]) == 0
    assert sa.inspect(database.engine).has_table(TABLE_NAME)
    assert declared.diffs(database, (TABLE_NAME,)) == []
    assert declared.drifts(database, (TABLE_NAME,)) == []
    assert cli.main(["--url", database.url, "migrate"]) == 0  # again: nothing to do
    command.downgrade(environment.alembic_config(database.url), "0011_queue_storage")
    assert not sa.inspect(database.engine).has_table(TABLE_NAME)


@only("postgresql")  # SQLite's schedules never had a table
def test_a_table_made_at_start_up_is_kept(database: Database) -> None:
    config = environment.alembic_config(database.url)
    command.upgrade(config, "0011_queue_storage")
    # what RateLimit.prepare created before the revision existed: FLOAT, an unnamed key
    with database.engine.begin() as connection:
        connection.exec_driver_sql(
            f"CREATE TABLE {TABLE_NAME} (name VARCHAR(450) NOT NULL, next_at FLOAT NOT NULL, "
            "PRIMARY KEY (name))"
        )
        connection.execute(rate_limit.RATE_TABLE.insert().values(name="orders", next_at=12.5))
    command.upgrade(config, "head")
    assert _schedules(database) == [("orders", 12.5)]
    assert declared.drifts(database, (TABLE_NAME,)) == []


@only("postgresql")
def test_start_up_then_migrate(database: Database) -> None:
    limit = rate_limit.RateLimit(database.engine, "orders", 50, 1.0, 5)
    limit.prepare()
    limit.prepare()  # a second process starting: the row is there already
    assert _schedules(database) == [("orders", 0.0)]
    assert cli.main(["--url", database.url, "migrate"]) == 0
    assert _schedules(database) == [("orders", 0.0)]
    assert declared.diffs(database, (TABLE_NAME,)) == []


@only("postgresql")
def test_verify_finds_a_drifted_schedule_table_and_repairs_it(database: Database) -> None:
    assert cli.main(["--url", database.url, "migrate"]) == 0
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f"ALTER TABLE {TABLE_NAME} ALTER COLUMN next_at TYPE integer")
    drifts = declared.drifts(database, (TABLE_NAME,))
    assert [(drift.kind, drift.subject) for drift in drifts] == [("type", "next_at")]
    with database.engine.begin() as connection:
        for statement in verify.repair_script(drifts):
            connection.exec_driver_sql(statement)
    assert declared.drifts(database, (TABLE_NAME,)) == []
