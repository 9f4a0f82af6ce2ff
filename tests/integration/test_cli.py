"""The sqlqueue command line, run as a real subprocess against real databases."""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import shlex
import socket
import subprocess
import sys
import threading
import time

import sqlalchemy as sa

import sqlqueue_orm
from sqlqueue_orm import OutgoingMessage
from tests.conftest import only


def sqlqueue(url, *args, check=True):
    env = {**os.environ, "SQLQUEUE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", *args],
        capture_output=True,
        text=True,
        check=check,
        env=env,
        timeout=120,
    )


@only("sqlite", "postgresql", "mssql")
def test_create_send_receive_json_round_trip(database):
    url = database.url
    assert sqlqueue(url, "create-queue", "orders", "audit").stdout.split() == [
        "created", "orders", "created", "audit",
    ]
    assert "exists" in sqlqueue(url, "create-queue", "orders").stdout
    message_id = sqlqueue(
        url, "send", "orders", "--body", "héllo/wörld", "--header", "a/b=c=d", "--ttbr", "60"
    ).stdout.strip()
    sqlqueue(url, "send", "orders", "--body", "second")
    assert sqlqueue(url, "peek", "orders").stdout.strip() == "2"
    listed = dict(line.split("\t") for line in sqlqueue(url, "list-queues").stdout.splitlines())
    assert listed == {"audit": "0", "orders": "2"}
    lines = sqlqueue(url, "receive", "orders", "--count", "5", "--json").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["body"] for r in records] == ["héllo/wörld", "second"]
    assert records[0]["message_id"] == message_id
    assert records[0]["headers"]["a/b"] == "c=d"
    assert records[0]["headers"]["NServiceBus.TimeToBeReceived"] == "00:01:00"
    assert records[0]["expired"] is False
    assert set(records[0]) == {"id", "message_id", "headers", "body", "expired"}
    assert sqlqueue(url, "receive", "orders", "--json").stdout == ""
    assert sqlqueue(url, "purge-expired", "orders").stdout.strip() == "0"


@only("sqlite")
def test_bad_input_exits_2_naming_the_value(database):
    result = sqlqueue(database.url, "receive", "orders", "--count", "0", check=False)
    assert result.returncode == 2 and "'0'" in result.stderr
    result = sqlqueue(
        database.url, "send", "orders", "--body", "x", "--header", "nokey", check=False
    )
    assert result.returncode == 2 and "nokey" in result.stderr
    database.transport().create_queue("orders")  # the file exists: only the queue is missing
    result = sqlqueue(database.url, "send", "nowhere", "--body", "x", check=False)
    assert result.returncode == 2 and "sqlqueue create-queue nowhere" in result.stderr
    result = sqlqueue(database.url, "send", "a@b@c@d", "--body", "x", check=False)
    assert result.returncode == 2 and "a@b@c@d" in result.stderr


def run_bytes(url, *args, stdin=None):
    """sqlqueue with bytes arguments and output (for bodies that are not text)."""
    env = {**os.environ, "SQLQUEUE_URL": url}
    return subprocess.run(
        [sys.executable.encode(), b"-m", b"sqlqueue_orm.cli", *args],
        input=stdin, capture_output=True, env=env, timeout=120,
    )


def one_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- 10.1: receive never deletes what it could not hand over; bodies printed losslessly ----------
BINARY = bytes(range(256)) * 3


@only("sqlite", "postgresql")
def test_binary_body_survives_a_round_trip_through_json(database, tmp_path):
    url = database.url
    sqlqueue(url, "create-queue", "bin")
    path = tmp_path / "body.bin"
    path.write_bytes(BINARY)
    sqlqueue(url, "send", "bin", "--body-file", str(path))
    assert run_bytes(url, b"send", b"bin", b"--body-file", b"-", stdin=BINARY).returncode == 0
    sqlqueue(url, "send", "bin", "--body", "plain text")
    sqlqueue(url, "send", "bin", "--body", "plain text")
    lines = sqlqueue(url, "browse", "bin", "--count", "10", "--json").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [base64.b64decode(r["body_base64"]) for r in records[:2]] == [BINARY, BINARY]
    assert "body" not in records[0]
    assert records[2]["body"] == "plain text"
    assert "body_base64" not in records[2]
    received = sqlqueue(url, "receive", "bin", "--count", "3", "--json").stdout.splitlines()
    assert [json.loads(line) for line in received] == records[:3]
    [last] = sqlqueue(url, "receive", "bin", "--json", "--base64").stdout.splitlines()
    assert base64.b64decode(json.loads(last)["body_base64"]) == b"plain text"
    assert sqlqueue(url, "peek", "bin").stdout.strip() in ("0", "1")  # estimate: max - min
    assert sqlqueue(url, "receive", "bin").stdout == ""


@only("sqlite")
def test_body_file_reads_dev_null_and_a_named_pipe(database, tmp_path):
    """Not only regular files: /dev/null is an empty body, a FIFO (as a shell's ``<(...)``
    gives) is read to its end."""
    url = database.url
    sqlqueue(url, "create-queue", "special")
    sqlqueue(url, "send", "special", "--body-file", os.devnull)
    fifo = tmp_path / "body.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as writer:
            writer.write(b"through a pipe")

    feeder = threading.Thread(target=feed)
    feeder.start()
    sqlqueue(url, "send", "special", "--body-file", str(fifo))
    feeder.join(10)
    lines = sqlqueue(url, "receive", "special", "--count", "2", "--json").stdout.splitlines()
    bodies = [json.loads(line).get("body") for line in lines]
    assert bodies == ["", "through a pipe"], lines


@only("sqlite")
def test_body_file_takes_any_bytes_of_any_size(database):
    url = database.url
    sqlqueue(url, "create-queue", "big")
    body = os.urandom(3 * 1024 * 1024)  # far beyond what a command line can carry
    assert run_bytes(url, b"send", b"big", b"--body-file", b"-", stdin=body).returncode == 0
    [line] = sqlqueue(url, "receive", "big", "--json").stdout.splitlines()
    assert base64.b64decode(json.loads(line)["body_base64"]) == body


@only("sqlite", "postgresql")
def test_receive_into_a_pipe_closed_early_loses_nothing(database):
    url = database.url
    sqlqueue(url, "create-queue", "orders")
    sent = [sqlqueue(url, "send", "orders", "--body", f"m{i}").stdout.strip() for i in range(5)]
    env = {**os.environ, "SQLQUEUE_URL": url}
    # A real shell pipe, as a user types it: head prints one line and exits.
    result = subprocess.run(
        f"{shlex.quote(sys.executable)} -m sqlqueue_orm.cli receive orders --count 5 --json"
        " | head -1",
        shell=True, capture_output=True, text=True, env=env, timeout=120,
    )
    shown = [json.loads(line)["message_id"] for line in result.stdout.splitlines()]
    assert shown == sent[:1]
    left = sqlqueue(url, "receive", "orders", "--count", "10", "--json").stdout.splitlines()
    remaining = [json.loads(line)["message_id"] for line in left]
    # Nothing lost: every message was either shown by head or is still in the queue, in order.
    assert remaining in (sent, sent[1:])
    assert "put back" in result.stderr and "Traceback" not in result.stderr


@only("sqlite")
def test_receive_into_a_closed_stdout_puts_the_messages_back(database):
    url = database.url
    sqlqueue(url, "create-queue", "orders")
    sent = [sqlqueue(url, "send", "orders", "--body", f"m{i}").stdout.strip() for i in range(3)]
    env = {**os.environ, "SQLQUEUE_URL": url}
    reader, writer = os.pipe()
    os.close(reader)  # nobody will ever read: the first write fails with EPIPE
    process = subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", "receive", "orders", "--count", "3"],
        stdout=writer, stderr=subprocess.PIPE, text=True, env=env, timeout=120,
    )
    os.close(writer)
    assert process.returncode == 1
    assert "3 message(s)" in one_line(process.stderr)
    left = sqlqueue(url, "receive", "orders", "--count", "10", "--json").stdout.splitlines()
    assert [json.loads(line)["message_id"] for line in left] == sent


@only("sqlite", "postgresql")
def test_receive_waits_until_a_slow_reader_has_read_each_message(database):
    """A reader that wakes late finds only what it was handed; the rest is still queued."""
    url = database.url
    transport = database.transport()  # the setup in this process: the receive is the command
    transport.create_queue("orders")
    sent = [transport.send("orders", OutgoingMessage(f"m{i}".encode())) for i in range(5)]
    env = {**os.environ, "SQLQUEUE_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "sqlqueue_orm.cli", "receive", "orders", "--count", "5", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    assert select.select([process.stdout], [], [], 60)[0]
    time.sleep(1.0)  # without the wait, all five lines are in the pipe and committed by now
    data = os.read(process.stdout.fileno(), 1 << 20)  # what head would read
    process.stdout.close()  # ... and head exits after its first line
    process.wait(timeout=60)
    process.stderr.close()
    first = json.loads(data.splitlines()[0])["message_id"]
    assert first == sent[0]
    assert data.count(b"\n") == 1  # handed over one at a time
    left = sqlqueue(url, "receive", "orders", "--count", "10", "--json").stdout.splitlines()
    assert [json.loads(line)["message_id"] for line in left] in (sent, sent[1:])


# -- 10.7: one error policy: bad input exits 2, an unreachable database 1, one line each ---------
@only("sqlite", "postgresql")
def test_bad_input_is_one_line_naming_the_value_and_exit_2(database):
    url = database.url
    database.transport().create_queue("orders")
    # A queue that does not exist is the database's answer: on every database.
    cases = [
        (["send", "nowhere", "--body", "x"], "sqlqueue create-queue nowhere"),
        (["receive", "nowhere"], "sqlqueue create-queue nowhere"),
        (["browse", "nowhere"], "sqlqueue create-queue nowhere"),
    ]
    if database.dialect == "sqlite":
        # Arguments only: the same checks whatever the database, so on one (each case is a
        # process of its own).
        cases += [
            (["receive", "orders", "--count", "10001"], "'10001'"),
            (["browse", "orders", "--count", "0"], "'0'"),
            (["send", "orders", "--body", "x", "--ttbr", "1e308"], "'1e308'"),
            (["send", "orders", "--body", "x", "--ttbr", "1e10"], "100 years"),
            (["send", "orders", "--body", "x", "--ttbr", "nan"], "'nan'"),
            (["send", "orders", "--body-file", "/no/such/file"], "/no/such/file"),
            (["purge-expired", "orders", "--batch", "x"], "'x'"),
            (["outbox", "dispatch", "--once", "--batch", "0"], "'0'"),
        ]
    for args, named in cases:
        result = sqlqueue(url, *args, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert named in one_line(result.stderr), (args, result.stderr)
    result = run_bytes(url, b"send", b"orders", b"--body", b"\xff\xfe")
    assert result.returncode == 2
    assert "not valid UTF-8" in one_line(result.stderr.decode())
    assert sqlqueue(url, "peek", "orders").stdout.strip() == "0"  # nothing was sent


def _unreachable(url, *args):
    result = sqlqueue(url, *args, check=False)
    assert result.returncode == 1, result.stderr
    return one_line(result.stderr)


def test_unreachable_postgresql_is_one_line_naming_host_and_cause():
    with socket.socket() as probe:  # a port on loopback that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://someone:secret@127.0.0.1:{port}/shop"
    for args in (["list-queues"], ["receive", "orders"], ["send", "orders", "--body", "x"]):
        line = _unreachable(url, *args)
        assert f"127.0.0.1:{port}" in line and "refused" in line.lower(), line
        assert "secret" not in line
    verbose = sqlqueue(url, "--verbose", "list-queues", check=False)
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


@only("postgresql")
def test_unknown_database_or_role_is_one_line_naming_it(database):
    parsed = sa.make_url(database.url)
    line = _unreachable(
        parsed.set(database="no_such_db").render_as_string(hide_password=False), "list-queues"
    )
    assert str(parsed.host) in line and "no_such_db" in line and "does not exist" in line
    line = _unreachable(
        parsed.set(username="no_such_role").render_as_string(hide_password=False), "peek", "q"
    )
    assert str(parsed.host) in line and "no_such_role" in line, line


def test_sqlite_file_in_a_missing_directory_is_one_line(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    line = _unreachable(f"sqlite:///{missing}/queue.db", "list-queues")
    assert str(missing) in line and "does not exist" in line
    assert not missing.exists()


# -- 10.8: what users reached for ---------------------------------------------------------------
def test_version():
    result = sqlqueue("sqlite://", "--version")
    assert result.stdout.strip() == f"sqlqueue {sqlqueue_orm.__version__}"


@only("sqlite", "postgresql")
def test_browse_shows_every_message_oldest_first_and_takes_none(database):
    url = database.url
    sqlqueue(url, "create-queue", "orders")
    sent = [sqlqueue(url, "send", "orders", "--body", "first").stdout.strip()]
    sent.append(sqlqueue(url, "send", "orders", "--body", "old", "--ttbr", "0.001").stdout.strip())
    sent += [sqlqueue(url, "send", "orders", "--body", f"m{i}").stdout.strip() for i in range(3)]
    time.sleep(0.05)
    if database.dialect == "postgresql":  # (a SQLite receive holds the write lock: browse waits)
        transport = database.transport()
        with database.engine.connect() as holder:
            # Another receiver holds the oldest message (uncommitted): browse still shows it.
            [held] = transport.receive("orders", connection=holder)
            assert held.message_id == sent[0]
            browsed = sqlqueue(url, "browse", "orders", "--count", "3", "--json").stdout
            holder.rollback()
    else:
        browsed = sqlqueue(url, "browse", "orders", "--count", "3", "--json").stdout
    records = [json.loads(line) for line in browsed.splitlines()]
    assert [r["message_id"] for r in records] == sent[:3]
    assert [r["expired"] for r in records] == [False, True, False]
    plain = sqlqueue(url, "browse", "orders", "--count", "10").stdout.splitlines()
    assert plain[1] == f"{sent[1]} (expired): old" and len(plain) == 5
    # Nothing was taken: every message is still there, in order.
    left = sqlqueue(url, "receive", "orders", "--count", "10", "--json").stdout.splitlines()
    assert [json.loads(line)["message_id"] for line in left] == sent


@only("sqlite", "postgresql")
def test_purge_all_asks_first_and_refuses_without_a_terminal(database):
    url = database.url
    transport = database.transport()  # the setup in this process: purge-all is the command
    transport.create_queue("orders")
    transport.send_many("orders", [OutgoingMessage(f"m{i}".encode()) for i in range(3)])
    env = {**os.environ, "SQLQUEUE_URL": url}
    refused = subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", "purge-all", "orders"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120,
    )
    assert refused.returncode == 2 and "--yes" in one_line(refused.stderr)
    assert len(sqlqueue(url, "browse", "orders", "--count", "10").stdout.splitlines()) == 3
    # On a terminal it asks; "n" keeps the messages, "y" deletes them.
    for answer, status, left in ((b"n\n", 2, 3), (b"y\n", 0, 0)):
        leader, follower = pty.openpty()
        process = subprocess.Popen(
            [sys.executable, "-m", "sqlqueue_orm.cli", "purge-all", "orders"],
            stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        os.close(follower)
        os.write(leader, answer)
        _out, err = process.communicate(timeout=120)
        os.close(leader)
        assert process.returncode == status, err
        assert b"Delete every message of queue 'orders'?" in err
        browsed = sqlqueue(url, "browse", "orders", "--count", "10").stdout.splitlines()
        if left:
            assert len(browsed) == left
        else:
            assert browsed == ["no messages in queue 'orders'"]
    sqlqueue(url, "send", "orders", "--body", "again")
    assert sqlqueue(url, "purge-all", "orders", "--yes").stdout.strip() == "1"
    assert sqlqueue(url, "browse", "orders").stdout == "no messages in queue 'orders'\n"


@only("postgresql")
def test_list_queues_looks_in_every_schema(database):
    url = database.url
    with database.engine.begin() as connection:
        connection.exec_driver_sql('CREATE SCHEMA "sales"')
        connection.exec_driver_sql('CREATE SCHEMA "Odd Name"')
    sqlqueue(url, "create-queue", "orders", "invoices@sales", "audit@[Odd Name]")
    sqlqueue(url, "send", "invoices@sales", "--body", "x")
    listed = dict(line.split("\t") for line in sqlqueue(url, "list-queues").stdout.splitlines())
    assert listed == {"orders": "0", "invoices@[sales]": "1", "audit@[Odd Name]": "0"}
    only_sales = sqlqueue(url, "list-queues", "--schema", "sales").stdout.splitlines()
    assert only_sales == ["invoices@[sales]\t1"]


@only("sqlite", "postgresql")
def test_outbox_dispatch_once_reports_what_it_deferred(database):
    from sqlqueue_orm import OutgoingMessage
    from sqlqueue_orm.sending.outbox import Outbox, OutboxOperation
    from testsupport.outbox_app import install

    transport = database.transport()
    install(transport, "billing")
    outbox = Outbox(transport)
    with database.engine.begin() as connection:
        for record_id, queue in (("good", "billing"), ("bad", "nowhere")):
            operation = OutboxOperation.from_prepared(
                queue, OutgoingMessage(b"x", message_id=record_id).prepare()
            )
            outbox.store(connection, record_id, [operation])
    result = sqlqueue(
        database.url, "outbox", "dispatch", "--once", "--grace-period", "0", check=False
    )
    assert result.returncode == 1  # a record waits for a retry
    assert "dispatched 1 record(s), 1 message(s) (billing: 1); deferred 1 record(s)" in (
        result.stdout
    )
    again = sqlqueue(
        database.url, "outbox", "dispatch", "--once", "--grace-period", "0", check=False
    )
    assert again.returncode == 1  # it still waits: tried again (not routed), deferred again
    assert "dispatched 0 record(s), 0 message(s); deferred 1 record(s)" in again.stdout


@only("sqlite")
def test_receive_does_not_hang_on_a_reader_that_reads_after_it_exits(database):
    url = database.url
    sqlqueue(url, "create-queue", "orders")
    sent = [sqlqueue(url, "send", "orders", "--body", f"m{i}").stdout.strip() for i in range(3)]
    env = {**os.environ, "SQLQUEUE_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "sqlqueue_orm.cli", "receive", "orders", "--count", "3", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )
    assert process.wait(timeout=120) == 0  # waits out its patience, then commits
    lines = process.stdout.read().splitlines()
    process.stdout.close()
    assert [json.loads(line)["message_id"] for line in lines] == sent
    assert sqlqueue(url, "receive", "orders").stdout == ""
