"""SIGTERM during handling: nothing lost; the in-flight message is handled once.

A handler that finishes within the shutdown timeout commits before the process exits; one that
does not is rolled back (its connection closed under it) and its message is handled after a
restart.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import sqlalchemy as sa

from sqlqueue_orm.receiving import TransactionMode
from tests.endpoint_app import UserBase, handled_ids, send_jobs

#: The handler a SIGTERM must not wait for: far longer than a stop and exit under any load.
HANDLER_SECONDS = 60


def start(database, handle_seconds: float, shutdown_timeout: float) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    command = [
        sys.executable, "-m", "tests.endpoint_app", database.url, "jobs",
        TransactionMode.TRANSACTION_SCOPE.value, "2", str(handle_seconds), str(shutdown_timeout),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line; stderr: {process.stderr.read()}")  # type: ignore[union-attr]


def watcher(database) -> sa.Engine:  # type: ignore[no-untyped-def]
    return sa.create_engine(database.url, poolclass=sa.pool.NullPool)


def test_sigterm_lets_the_handler_in_flight_finish(database):
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    [sent] = send_jobs(transport, "jobs", 1)
    process = start(database, handle_seconds=1.5, shutdown_timeout=20)
    wait_for_line(process, "handling")
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "stopped" in out
    assert time.monotonic() - began < 15
    assert handled_ids(watcher(database)) == [sent]
    assert transport.peek("jobs") == 0


def test_sigterm_rolls_back_a_handler_past_the_timeout_and_a_restart_handles_it(database):
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    [sent] = send_jobs(transport, "jobs", 1)
    process = start(database, handle_seconds=HANDLER_SECONDS, shutdown_timeout=0.5)
    wait_for_line(process, "handling")
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=HANDLER_SECONDS * 0.75)
    assert process.returncode == 0, err
    # It did not wait for the handler: the stop and the exit are quick, if slowed by a loaded
    # machine; waiting for the handler would take all of HANDLER_SECONDS.
    assert time.monotonic() - began < HANDLER_SECONDS / 2
    assert "rolling them back" in err
    engine = watcher(database)
    assert handled_ids(engine) == []
    [back] = transport.browse("jobs")  # the message returned to the queue
    assert back.message_id == sent

    restarted = start(database, handle_seconds=0, shutdown_timeout=5)
    wait_for_line(restarted, "handling")
    deadline = time.monotonic() + 30
    while handled_ids(engine) != [sent]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    restarted.send_signal(signal.SIGTERM)
    restarted.communicate(timeout=30)
    assert restarted.returncode == 0
    assert handled_ids(engine) == [sent]
    assert transport.peek("jobs") == 0
