"""PostgreSQL: running needs only SELECT, INSERT and DELETE; installing needs more."""

from __future__ import annotations

import logging
import multiprocessing
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import DatabaseError, OutgoingMessage, QueueAddress, Transport, db
from tests.conftest import only
from tests.integration import workers


@pytest.fixture
def roles(database):
    created: list[str] = []
    yield created
    with database.engine.begin() as connection:
        for role in created:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


def _restricted_url(database, roles, privileges: str) -> str:
    role = f"queue_runner_{uuid.uuid4().hex[:8]}"
    roles.append(role)
    address = QueueAddress("jobs", "app")
    installer = database.transport()
    installer.create_queue(address)
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        connection.exec_driver_sql(f"GRANT USAGE ON SCHEMA app TO {role}")
        connection.exec_driver_sql(f"GRANT {privileges} ON app.jobs TO {role}")
    return sa.make_url(database.url).set(username=role).render_as_string(hide_password=False)


@only("postgresql")
def test_a_role_with_select_insert_delete_only_can_run(database, roles, caplog):
    url = _restricted_url(database, roles, "SELECT, INSERT, DELETE")
    runner = Transport(url)
    with caplog.at_level(logging.WARNING, logger="sqlqueue_orm"):
        runner.send("jobs@app", OutgoingMessage(b"one"))
        runner.send_many("jobs@app", [OutgoingMessage(b"two", time_to_be_received=0.01)])
        runner.send("jobs@app", OutgoingMessage(b"three"))
        assert runner.peek("jobs@app") == 3
        received = runner.receive("jobs@app", 2)
        assert [m.body for m in received] == [b"one", b"two"]
        assert runner.purge_expired("jobs@app") == 0
        assert [m.body for m in runner.receive("jobs@app")] == [b"three"]
    lines = [record.getMessage() for record in caplog.records]
    assert any("advisory locks" in line and "jobs" in line for line in lines)
    with pytest.raises(DatabaseError, match="permission denied"):
        runner.create_queue("jobs2@app")
    runner.close()


@only("postgresql")
def test_restricted_role_receivers_still_get_each_message_once(database, roles):
    url = _restricted_url(database, roles, "SELECT, INSERT, DELETE")
    database.transport().send_many(
        "jobs@app", [OutgoingMessage(b"w", message_id=f"m{i}") for i in range(2_000)]
    )
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        results = pool.starmap(workers.drain, [(url, "jobs@app", seed) for seed in range(3)])
    everything = [message_id for result in results for message_id in result]
    assert sorted(everything) == sorted(f"m{i}" for i in range(2_000))


@only("postgresql")
def test_role_with_update_uses_skip_locked(database, roles, caplog):
    url = _restricted_url(database, roles, "SELECT, INSERT, DELETE, UPDATE")
    engine = db.create_engine(url)
    runner = Transport(engine)
    runner.send("jobs@app", OutgoingMessage(b"x"))
    with caplog.at_level(logging.WARNING, logger="sqlqueue_orm"):
        assert [m.body for m in runner.receive("jobs@app")] == [b"x"]
    assert not any("advisory" in r.getMessage() for r in caplog.records)
    engine.dispose()
