"""Revision 0015_endpoint_control: the control table and the action log, declared once.

`sqlqueue migrate` creates both tables as the models declare them (autogenerate finds no
difference, verify no drift); tables the control API made on first use before the migration are
kept with their rows; the downgrade drops both. The offline T-SQL is checked in
tests/tsql/test_endpoint_control.py.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from sqlqueue_orm import cli, control
from sqlqueue_orm.migration import environment
from sqlqueue_orm.models.endpoint_control import LOG_TABLE_NAME, TABLE_NAME
from tests.conftest import Database
from tests.migration import declared

NAMES = (TABLE_NAME, LOG_TABLE_NAME)


def test_migrate_creates_the_declared_tables_and_downgrade_drops_them(database: Database) -> None:
    assert cli.main(["--url", database.url, "migrate"]) == 0
    inspector = sa.inspect(database.engine)
    assert all(inspector.has_table(name) for name in NAMES)
    assert declared.diffs(database, NAMES) == []
    assert declared.drifts(database, NAMES) == []
    command.downgrade(environment.alembic_config(database.url), "0012_rate_limits")
    inspector = sa.inspect(database.engine)
    assert not any(inspector.has_table(name) for name in NAMES)


def test_tables_made_on_first_use_are_kept(database: Database) -> None:
    transport = database.transport()
    transport.create_queue("sales")
    command.upgrade(environment.alembic_config(database.url), "0012_rate_limits")
    control.pause(transport, "sales")  # creates both tables
    assert cli.main(["--url", database.url, "migrate"]) == 0
    state = control.state(transport, "sales")
    assert state is not None and state.paused
    assert [action.action for action in control.log(transport)] == ["pause"]
    assert declared.diffs(database, NAMES) == []
    control.resume(transport, "sales")  # the log's identity goes on after the migration
    assert [action.action for action in control.log(transport)] == ["resume", "pause"]
