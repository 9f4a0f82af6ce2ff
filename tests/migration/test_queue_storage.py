"""Revision 0011_queue_storage: PostgreSQL queue tables made before get their storage settings.

A queue table created without them (by an older version, or by .NET's installer) gets
``fillfactor`` and the autovacuum thresholds from ``sqlqueue migrate``, online and from the
offline script; its messages stay; ``sqlqueue verify`` then finds no storage drift; the
downgrade resets them.
"""

from __future__ import annotations

import io

import sqlalchemy as sa
from alembic import command

from sqlqueue_orm import OutgoingMessage, cli, dialects
from sqlqueue_orm.migration import environment
from tests.conftest import Database, only

QUEUE = "sales orders"
WANTED = {f"{name}={value}" for name, value in dialects.postgresql.QUEUE_STORAGE}


def _options(database: Database) -> set[str]:
    with database.engine.connect() as connection:
        return set(connection.scalars(
            sa.text("SELECT unnest(reloptions) FROM pg_class WHERE relname = :name"),
            {"name": QUEUE},
        ))


def _table_made_before(database: Database) -> None:
    transport = database.transport()
    transport.create_queue(QUEUE)
    names = ", ".join(name for name, _ in dialects.postgresql.QUEUE_STORAGE)
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f'ALTER TABLE "{QUEUE}" RESET ({names})')
    transport.send(QUEUE, OutgoingMessage(b"kept"))
    assert not _options(database) & WANTED


@only("postgresql")
def test_migrate_gives_existing_queue_tables_their_storage_settings(database: Database) -> None:
    _table_made_before(database)
    assert cli.main(["--url", database.url, "verify"]) == 1
    assert cli.main(["--url", database.url, "migrate"]) == 0
    assert WANTED <= _options(database)
    assert cli.main(["--url", database.url, "verify"]) == 0
    config = environment.alembic_config(database.url)
    command.downgrade(config, "0010_subscription_routing")
    assert not _options(database) & WANTED
    command.upgrade(config, "head")
    assert WANTED <= _options(database)
    assert [message.body for message in database.transport().receive(QUEUE)] == [b"kept"]


@only("postgresql")
def test_the_offline_script_sets_them_twice_in_a_row(database: Database) -> None:
    _table_made_before(database)
    out = io.StringIO()
    config = environment.alembic_config(database.url, stdout=out)
    command.upgrade(config, "0010_subscription_routing:0011_queue_storage", sql=True)
    script = out.getvalue().replace(
        "UPDATE sqlqueue_alembic_version", "-- UPDATE sqlqueue_alembic_version"
    )
    for _ in range(2):
        with database.engine.connect() as connection:
            connection.connection.driver_connection.execute(script)  # type: ignore[union-attr]
    assert WANTED <= _options(database)
