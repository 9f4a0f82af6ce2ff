"""Revision 0014_endpoint_health: the heartbeat and metrics tables, declared once, made by Alembic.

`sqlqueue migrate` creates ``sqlqueue_endpoints`` and ``sqlqueue_queue_metrics`` as the models
declare them (autogenerate finds no difference, verify no drift); tables an endpoint created at
start-up are kept with their rows; the downgrade drops both. The offline T-SQL is checked in
tests/tsql/test_endpoint_health.py.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from sqlqueue_orm import cli, health
from sqlqueue_orm.migration import environment
from sqlqueue_orm.models.endpoint_health import ENDPOINTS_TABLE, METRICS_TABLE
from tests.conftest import Database, only
from tests.migration import declared

TABLES = (ENDPOINTS_TABLE, METRICS_TABLE)


@only("sqlite", "postgresql")
def test_migrate_creates_the_declared_tables_and_downgrade_drops_them(database: Database):
    assert cli.main(["--url", database.url, "migrate"]) == 0
    for table in TABLES:
        assert sa.inspect(database.engine).has_table(table)
    assert declared.diffs(database, TABLES) == []
    assert declared.drifts(database, TABLES) == []
    assert cli.main(["--url", database.url, "migrate"]) == 0  # again: nothing to do
    command.downgrade(environment.alembic_config(database.url), "0012_rate_limits")
    for table in TABLES:
        assert not sa.inspect(database.engine).has_table(table)


@only("sqlite", "postgresql")
def test_tables_an_endpoint_made_are_kept_with_their_rows(database: Database):
    command.upgrade(environment.alembic_config(database.url), "0012_rate_limits")
    health.create_tables(database.engine)
    sample = health.QueueSample(1.0e9, 3, 4.5, 2, 1)
    health.write_samples(database.engine, "instance-1", [("orders", sample)])
    assert cli.main(["--url", database.url, "migrate"]) == 0
    [metrics] = health.read_queue_metrics(database.engine, ["orders"], now=1.0e9 + 1).values()
    assert list(metrics.samples) == [sample]
    assert declared.diffs(database, TABLES) == []
