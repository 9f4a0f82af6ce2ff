"""``sqlqueue run`` stopped by a signal: the last beat says stopped and the samples lose nothing.

SIGTERM and SIGINT (Ctrl-C) stop the process as ``Endpoint.stop()`` does: the handlers in
flight finish, then a last sample and a last beat saying stopped are written before the
process exits. A second Ctrl-C while stopping rolls the handlers still running back at once
(their messages return to the queue) and logs no stop line twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from sqlqueue_orm import OutgoingMessage, health
from tests.endpoint_app import Job, UserBase, handled_ids
from tests.integration.test_endpoint_health import eventually
from testsupport.outbox_app import REPO, sqlqueue_command


def run_beating(database) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    """``sqlqueue run tests.health_app:beating`` in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [*sqlqueue_command(), "--url", database.url, "run", "tests.health_app:beating"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )


def instance_of(database, process: subprocess.Popen[str]) -> list[health.Instance]:  # type: ignore[no-untyped-def]
    """The heartbeat rows of *process* (none before its first beat)."""
    found = health.read_endpoints(database.engine)
    return [each for each in found if each.process_id == process.pid]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_run_writes_a_stopped_beat_and_a_last_sample_with_every_message(
    database, signum
):
    """The signal's stop ran on a daemon thread and ``run()`` returned once the pumps had
    stopped: the process exited before the last sample and the stopped beat were written, so
    the instance showed running, then stale, and the samples missed the last messages."""
    transport = database.transport()
    transport.create_queue("beating")
    UserBase.metadata.create_all(database.engine)
    count = 12
    transport.send_many("beating", [OutgoingMessage(Job(number=0)) for _ in range(count)])
    process = run_beating(database)
    try:
        eventually(
            lambda: instance_of(database, process),
            lambda found: len(found) == 1 and found[0].processed == count,
            "a beat after every message was handled",
        )
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert process.returncode == 0, err
    assert f"handled {count}, failed 0" in out, out
    [stopped] = instance_of(database, process)
    assert (stopped.state, stopped.processed, stopped.in_flight) == (health.STOPPED, count, 0)
    metrics = health.read_queue_metrics(database.engine, ["beating"])["beating"]
    assert sum(sample.processed for sample in metrics.samples) == count
    assert len(handled_ids(database.engine)) == count


def test_a_second_ctrl_c_while_stopping_rolls_back_at_once_and_logs_each_line_once(database):
    """A second Ctrl-C logged "SIGINT received; stopping" again and started a second stop,
    whose pumps logged "endpoint stopped" again. Now it ends the wait for the handler in
    flight: rolled back, its message back in the queue (nothing lost, nothing handled twice),
    and the last beat still says stopped."""
    transport = database.transport()
    transport.create_queue("beating")
    UserBase.metadata.create_all(database.engine)
    [sent] = transport.send_many("beating", [OutgoingMessage(Job(number=60_000))])
    process = run_beating(database)
    try:
        assert process.stdout is not None
        # (SQLite's beats wait for the write lock the handler's receive holds)
        assert process.stdout.readline() == "handling\n", process.stderr.read()  # type: ignore[union-attr]
        began = time.monotonic()
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert process.returncode == 0, err
    assert "handled 0, failed 0" in out, out
    lines = err.splitlines()
    assert sum("SIGINT received; stopping" in line for line in lines) == 1, err
    assert sum("endpoint stopped" in line for line in lines) == 1, err
    assert sum("rolling them back" in line for line in lines) == 1, err
    # shutdown_timeout is 30 s: the second Ctrl-C ended the wait, not the timeout
    assert time.monotonic() - began < 20
    assert handled_ids(database.engine) == []
    [back] = transport.browse("beating")
    assert back.message_id == sent
    [stopped] = instance_of(database, process)
    assert (stopped.state, stopped.in_flight) == (health.STOPPED, 0)
