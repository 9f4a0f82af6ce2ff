"""The outbox dispatcher: in process, and as the real ``sqlqueue outbox dispatch`` process."""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import signal
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import OutboxOperation, utc_now
from sqlqueue_orm.session import UnitOfWork
from tests.conftest import only
from testsupport.outbox_app import (
    REPO,
    Order,
    count,
    install,
    outbox_rows,
    queue_message_ids,
    sqlqueue_command,
)

FAST = DispatcherSettings(grace_period=0, interval=0.05, initial_backoff=0.05, max_backoff=0.2)


@pytest.fixture
def app(database):
    transport = database.transport()
    install(transport, "billing", "shipping")
    return transport


def _operation(destination, message_id, body=b"x"):
    return OutboxOperation.from_prepared(
        destination, OutgoingMessage(body, message_id=message_id).prepare()
    )


def _store(engine, outbox, records, now=None):
    with engine.begin() as connection:
        for record_id, operations in records:
            outbox.store(connection, record_id, operations, now=now)


def _dispatch_command(url, *args, **kwargs):
    return subprocess.run(
        [*sqlqueue_command(), "--url", url, "outbox", "dispatch", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        **kwargs,
    )


def test_dispatches_pending_records_and_marks_them(database, app):
    outbox = Outbox(app)
    _store(
        database.engine,
        outbox,
        [
            ("r1", [_operation("billing", "b1"), _operation("shipping", "s1")]),
            ("r2", [_operation("billing", "b2")]),
        ],
    )
    dispatcher = OutboxDispatcher(outbox, FAST)
    report = dispatcher.dispatch_pending()
    assert (report.claimed, report.dispatched, dict(report.messages)) == (
        2,
        2,
        {"billing": 2, "shipping": 1},
    )
    assert sorted(queue_message_ids(database.engine, "billing")) == ["b1", "b2"]
    assert queue_message_ids(database.engine, "shipping") == ["s1"]
    assert sorted(outbox_rows(database.engine)) == [("r1", True, "[]"), ("r2", True, "[]")]
    assert dispatcher.dispatch_pending().claimed == 0


def test_records_younger_than_the_grace_period_are_left_to_the_inline_dispatch(database, app):
    outbox = Outbox(app)
    _store(database.engine, outbox, [("young", [_operation("billing", "y")])])
    _store(
        database.engine,
        outbox,
        [("old", [_operation("billing", "o")])],
        now=utc_now() - dt.timedelta(seconds=60),
    )
    report = OutboxDispatcher(outbox, DispatcherSettings(grace_period=30)).dispatch_pending()
    assert report.dispatched == 1
    assert queue_message_ids(database.engine, "billing") == ["o"]


def test_a_record_that_cannot_be_dispatched_waits_and_the_others_go(database, app, caplog):
    outbox = Outbox(app)
    _store(
        database.engine,
        outbox,
        [
            ("good-1", [_operation("billing", "g1")]),
            ("missing-queue", [_operation("nowhere", "n1")]),
            ("good-2", [_operation("shipping", "g2")]),
        ],
    )
    with database.engine.begin() as connection:
        outbox.store(connection, "garbled", [])
        connection.execute(
            sa.text('UPDATE "OutboxData" SET "Operations" = :text WHERE "MessageId" = :id'),
            {"text": "[{not json", "id": "garbled"},
        )
    with caplog.at_level(logging.WARNING, logger="sqlqueue_orm.sending"):
        report = OutboxDispatcher(outbox, FAST).dispatch_pending()
    assert (report.dispatched, report.deferred) == (2, 2)
    assert queue_message_ids(database.engine, "billing") == ["g1"]
    assert queue_message_ids(database.engine, "shipping") == ["g2"]
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert "nowhere" in errors and "garbled" in errors
    pending = {row[0] for row in outbox_rows(database.engine) if not row[1]}
    assert pending == {"missing-queue", "garbled"}
    # deferred by retry_delay: not claimed again now...
    assert OutboxDispatcher(outbox, FAST).dispatch_pending().claimed == 0
    # ...but once the queue exists and the delay has passed, it goes.
    app.create_queue("nowhere")
    report = outbox.dispatch_due(now=utc_now() + dt.timedelta(seconds=31), grace_period=0)
    assert report.dispatched == 1 and queue_message_ids(database.engine, "nowhere") == ["n1"]


def test_destinations_in_other_databases_via_a_routes_file(database, app, tmp_path):
    remote_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"ledger": remote_url}))
    outbox = Outbox(app)
    _store(
        database.engine,
        outbox,
        [
            ("r1", [_operation("ledger", "l1"), _operation("billing", "b1")]),
        ],
    )
    remote = install_remote(remote_url)
    result = _dispatch_command(
        database.url, "--once", "--grace-period", "0", "--routes", str(routes)
    )
    assert result.returncode == 0, result.stderr
    assert "dispatched 1 record(s), 2 message(s) (billing: 1, ledger: 1)" in result.stdout
    assert queue_message_ids(remote, "ledger") == ["l1"]
    assert queue_message_ids(database.engine, "billing") == ["b1"]
    remote.dispose()


def install_remote(url):
    from sqlqueue_orm import Transport

    transport = Transport(url)
    transport.create_queue("ledger")
    return transport.engine


def test_bad_dispatch_options_exit_2_naming_the_value(database, app, tmp_path):
    result = _dispatch_command(database.url, "--once", "--batch", "0")
    assert result.returncode == 2 and "--batch: '0'" in result.stderr
    result = _dispatch_command(database.url, "--once", "--routes", str(tmp_path / "none.toml"))
    assert result.returncode == 2 and "none.toml" in result.stderr


@pytest.mark.slow
def test_sigkill_after_commit_before_inline_dispatch_the_dispatcher_delivers(database, app):
    crashed = subprocess.run(
        [sys.executable, "-m", "testsupport.outbox_app", database.url, "25"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert count(database.engine, Order) == 1  # the commit happened...
    assert count(database.engine, "billing") == 0  # ...the inline dispatch did not
    [(_, dispatched, _)] = outbox_rows(database.engine)
    assert not dispatched
    result = _dispatch_command(database.url, "--once", "--grace-period", "0")
    assert result.returncode == 0, result.stderr
    delivered = queue_message_ids(database.engine, "billing")
    assert sorted(delivered) == sorted(f"crash-{number}" for number in range(25))
    assert [row[1] for row in outbox_rows(database.engine)] == [True]


@pytest.mark.slow
def test_two_dispatcher_processes_deliver_5000_records_exactly_once(database, app):
    outbox = Outbox(app)
    with database.engine.begin() as connection:
        outbox.store_many(
            connection,
            ((f"r-{n}", [_operation("billing", f"m-{n}", b"%d" % n)]) for n in range(5000)),
        )
    command = [
        *sqlqueue_command(),
        "--url",
        database.url,
        "outbox",
        "dispatch",
        "--once",
        "--grace-period",
        "0",
        "--batch",
        "50",
    ]
    processes = [
        subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    delivered = collections.Counter(queue_message_ids(database.engine, "billing"))
    assert len(delivered) == 5000 and set(delivered.values()) == {1}
    assert set(delivered) == {f"m-{n}" for n in range(5000)}
    dispatched = sum(int(stdout.split()[1]) for stdout, _ in outputs)  # "dispatched N record(s)"
    assert dispatched == 5000
    assert all(row[1] for row in outbox_rows(database.engine))


@only("sqlite", "postgresql")
def test_the_service_stops_cleanly_on_sigterm(database, app):
    process = subprocess.Popen(
        [
            *sqlqueue_command(),
            "--url",
            database.url,
            "outbox",
            "dispatch",
            "--grace-period",
            "0",
            "--interval",
            "0.1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in process.stderr:  # the log: wait until the service runs
            lines.append(line)
            if "dispatcher started" in line:
                break
        with UnitOfWork(app, mode="outbox", dispatch_inline=False) as uow:
            uow.send("billing", OutgoingMessage(b"x", message_id="while-running"))
        for line in process.stderr:
            lines.append(line)
            if "dispatched 1 record(s)" in line:
                break
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
    log = "".join(lines) + rest
    assert process.returncode == 0, log
    assert "billing: 1" in log and "SIGTERM received" in log and "dispatcher stopped" in log
    assert queue_message_ids(database.engine, "billing") == ["while-running"]


def _wait_for(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


@only("postgresql")
def test_the_dispatcher_survives_the_database_going_away_and_coming_back(
    database, app, postgres_admin, caplog
):
    name = sa.make_url(database.url).database
    outbox = Outbox(app)
    _store(database.engine, outbox, [("r1", [_operation("billing", "b1")])])

    def allow_connections(allowed):
        with postgres_admin.connect() as connection:
            connection.exec_driver_sql(
                f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}'
            )
            if not allowed:
                connection.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )

    dispatcher = OutboxDispatcher(outbox, FAST)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    allow_connections(False)
    try:
        with caplog.at_level(logging.INFO, logger="sqlqueue_orm.sending"):
            thread.start()
            _wait_for(lambda: dispatcher.failures >= 3, "three failed attempts")
            allow_connections(True)
            _wait_for(lambda: dispatcher.total.dispatched == 1, "the dispatch after recovery")
            dispatcher.stop()
            thread.join(timeout=30)
    finally:
        allow_connections(True)
        dispatcher.stop()
    assert not thread.is_alive()
    assert queue_message_ids(database.engine, "billing") == ["b1"]
    messages = [record.getMessage() for record in caplog.records]
    assert any("database failed" in message for message in messages)
    assert any("database is back" in message for message in messages)
