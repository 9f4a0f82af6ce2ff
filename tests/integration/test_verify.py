"""``sqlqueue verify``: a fresh database passes; each planted drift is found and its repair works.

Every drift is planted with real DDL on a real database (SQLite and PostgreSQL), found by
:func:`sqlqueue_orm.verify.verify`, and repaired by running the statements it printed; the
message waiting in the queue survives the repair byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from sqlqueue_orm import cli, db, dialects, verify
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.models.base import Base
from sqlqueue_orm.models.queue_table import build_queue_table, index_name
from sqlqueue_orm.receiving import wakeup
from tests.conftest import Database, only

#: The wake-up trigger's name on every PostgreSQL queue table.
TRIGGER = dialects.postgresql.NOTIFY_WAKEUP.trigger

#: An awkward name: upper case, a dash, a space, quotes (names reach SQL only quoted).
QUEUE = "Orders-v2 'eu'"


def _install(database: Database) -> None:
    transport = database.transport()
    transport.create_queue(QUEUE)
    transport.create_delayed_table(QUEUE)
    transport.create_subscription_table()
    Base.metadata.create_all(database.engine)
    transport.send(QUEUE, OutgoingMessage(body=b"kept \x00\xff"))
    if database.dialect == "postgresql":
        wakeup.install_trigger(database.engine, transport.queues.address(QUEUE))


def _drifts(database: Database) -> list[verify.Drift]:
    wanted = [QUEUE] if database.dialect == "postgresql" else []
    with database.engine.connect() as connection:
        return verify.verify(connection, wakeup_queues=wanted)


def _repair(database: Database, drifts: list[verify.Drift]) -> None:
    # On a connection of its own, as a DBA runs the printed script: a pooled SQLite connection
    # that has not read since another one dropped the index still has it in its schema cache,
    # and SQLite checks "already exists" against that cache before noticing the change.
    engine = db.create_engine(database.url)
    try:
        with engine.begin() as connection:
            for statement in verify.repair_script(drifts):
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def _bodies(database: Database) -> list[bytes]:
    table = build_queue_table(sa.MetaData(), QUEUE, dialect=database.engine)
    with database.engine.connect() as connection:
        return [bytes(body) for body in connection.scalars(sa.select(table.c.Body))]


def _quoted(database: Database, name: str) -> str:
    return str(database.engine.dialect.identifier_preparer.quote(name))


def _run(database: Database, statement: str) -> None:
    with database.engine.begin() as connection:
        connection.exec_driver_sql(statement)


def _expires_index(database: Database) -> str:
    return index_name(QUEUE, "Index_Expires", database.dialect)


def drop_index(database: Database) -> tuple[str, str]:
    _run(database, f"DROP INDEX {_quoted(database, _expires_index(database))}")
    return "index", _expires_index(database)


def change_predicate(database: Database) -> tuple[str, str]:
    drop_index(database)
    table = build_queue_table(sa.MetaData(), QUEUE, dialect=database.engine)
    later = table.c.Expires > sa.literal_column("'2000-01-01'")
    index = sa.Index(_expires_index(database), table.c.Expires,
                     postgresql_where=later, sqlite_where=later)
    with database.engine.begin() as connection:
        index.create(connection)
    return "index", _expires_index(database)


def drop_column(database: Database) -> tuple[str, str]:
    # A column outside the signature on SQLite; on PostgreSQL every column is in it, and a
    # table that lost one is still found.
    column = "CorrelationId" if database.dialect == "sqlite" else "body"
    table = _quoted(database, QUEUE)
    _run(database, f"ALTER TABLE {table} DROP COLUMN {_quoted(database, column)}")
    return "column", column


def change_type(database: Database) -> tuple[str, str]:
    table = _quoted(database, QUEUE)
    if database.dialect == "sqlite":  # no ALTER COLUMN: drop it and add it as a number
        # (not narrower: SQLite enforces no declared length, so VARCHAR(10) is no drift there)
        column = _quoted(database, "ReplyToAddress")
        _run(database, f"ALTER TABLE {table} DROP COLUMN {column}")
        _run(database, f"ALTER TABLE {table} ADD COLUMN {column} INTEGER")
        return "type", "ReplyToAddress"
    _run(database, f"ALTER TABLE {table} ALTER COLUMN headers TYPE varchar(4000)")
    return "type", "headers"


def drop_trigger(database: Database) -> tuple[str, str]:
    wakeup.remove_trigger(database.engine, database.transport().queues.address(QUEUE))
    return "trigger", TRIGGER


DRIFTS: list[Callable[[Database], tuple[str, str]]] = [
    drop_index, change_predicate, drop_column, change_type,
]


def test_a_fresh_database_has_no_drift(database: Database) -> None:
    _install(database)
    assert _drifts(database) == []


@pytest.mark.parametrize("plant", DRIFTS, ids=[plant.__name__ for plant in DRIFTS])
def test_each_planted_drift_is_found_and_its_repair_clears_it(
    database: Database, plant: Callable[[Database], tuple[str, str]]
) -> None:
    _install(database)
    kind, subject = plant(database)
    drifts = _drifts(database)
    assert (kind, subject) in [(drift.kind, drift.subject) for drift in drifts]
    assert all(drift.table == QUEUE for drift in drifts)
    _repair(database, drifts)
    assert _drifts(database) == []
    if subject != "body":  # the dropped body column took the body with it
        assert _bodies(database) == [b"kept \x00\xff"]


@only("postgresql")
def test_a_missing_wakeup_trigger_is_found_and_reinstalled(database: Database) -> None:
    _install(database)
    drop_trigger(database)
    with database.engine.connect() as connection:
        assert verify.verify(connection) == []  # not expected anywhere: nothing to say
    drifts = _drifts(database)
    assert [(drift.kind, drift.subject) for drift in drifts] == [("trigger", TRIGGER)]
    _repair(database, drifts)
    assert _drifts(database) == []


@only("postgresql")
def test_queue_tables_get_storage_settings_and_verify_restores_them(database: Database) -> None:
    _install(database)
    with database.engine.connect() as connection:
        options = set(connection.scalars(
            sa.text("SELECT unnest(reloptions) FROM pg_class WHERE relname = :name"),
            {"name": QUEUE},
        ))
    assert {"fillfactor=100", "autovacuum_vacuum_threshold=1000",
            "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_cost_delay=0"} <= options
    # A table made before (or by .NET's installer) lacks them: verify names each, and its repair.
    _run(database, f"ALTER TABLE {_quoted(database, QUEUE)} RESET "
                   "(autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor)")
    drifts = _drifts(database)
    assert sorted((drift.kind, drift.subject, drift.found) for drift in drifts) == [
        ("storage", "autovacuum_vacuum_scale_factor", "unset"),
        ("storage", "autovacuum_vacuum_threshold", "unset"),
    ]
    _repair(database, drifts)
    assert _drifts(database) == []


def test_command_exit_status_and_json(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(database)
    assert cli.main(["--url", database.url, "verify"]) == 0
    assert "no drift" in capsys.readouterr().out
    drop_index(database)
    assert cli.main(["--url", database.url, "verify"]) == 1
    printed = capsys.readouterr().out
    assert f"index {_expires_index(database)}: found missing" in printed
    assert "CREATE INDEX" in printed
    assert cli.main(["--url", database.url, "verify", "--json"]) == 1
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(record["kind"], record["found"]) for record in records] == [("index", "missing")]
    assert cli.main(["--url", database.url, "verify", "--schema", "no such schema"]) == 2
    assert "'no such schema' does not exist" in capsys.readouterr().err
