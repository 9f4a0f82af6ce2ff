"""``sqlqueue run`` stopped by a signal: the last beat says stopped and the samples lose nothing.

SIGTERM and SIGINT (Ctrl-C) stop the process as ``Endpoint.stop()`` does: the handlers in
flight finish, then a last sample and a last beat saying stopped are written before the
process exits.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from sqlqueue_orm import OutgoingMessage, health
from tests.endpoint_app import Job, UserBase, handled_ids
from tests.integration.test_endpoint_health import eventually
from tests.outbox_app import REPO, sqlqueue_command


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

