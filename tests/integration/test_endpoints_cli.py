"""``sqlqueue endpoints``: each instance from its heartbeats, running, stale or stopped."""

from __future__ import annotations

import json
import socket
import time

import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, health
from sqlqueue_orm.receiving import Endpoint
from tests.conftest import only
from tests.endpoint_app import Job
from tests.integration.cli_process import one_line, sqlqueue
from tests.integration.test_endpoint_health import eventually


def _out(database, tmp_path, *args: str) -> str:
    result = sqlqueue("--url", database.url, "endpoints", *args, cwd=tmp_path)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


@only("sqlite", "postgresql")
def test_endpoints_lists_running_stopped_and_stale_instances(database, tmp_path):
    assert _out(database, tmp_path) == "no endpoints\n"
    assert _out(database, tmp_path, "--json") == "[]\n"

    transport = database.transport()
    endpoint = Endpoint("billing", transport, peek_delay=0.1, heartbeat_interval=0.2)
    endpoint.handle(Job, lambda job, context: None)
    endpoint.start()
    try:
        transport.send_many("billing", [OutgoingMessage(Job(number=n)) for n in range(2)])
        eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: bool(found) and found[0].processed == 2,
            "the beat after two messages",
        )
        [record] = [json.loads(line) for line in _out(database, tmp_path, "--json").splitlines()]
        assert record["endpoint"] == "billing"
        assert record["state"] == "running"
        assert (record["processed"], record["failed"]) == (2, 0)
        assert record["started_at"].endswith("+00:00")
    finally:
        endpoint.stop()
    [text] = _out(database, tmp_path).splitlines()
    fields = text.split("\t")
    assert fields[0] == "billing"
    assert fields[1].startswith("stopped ") and fields[1].endswith(" ago")
    assert fields[3] == "processed 2"  # a run shorter than a minute claims no rate

    # an instance whose last beat is twelve minutes old is stale, and says for how long
    with database.engine.begin() as connection:
        connection.execute(
            health.ENDPOINTS.update().values(state="running", last_seen=time.time() - 12 * 60)
        )
    [text] = _out(database, tmp_path).splitlines()
    assert text.split("\t")[1] == "stale for 12 min"
    assert _out(database, tmp_path, "--state", "running") == "no endpoints\n"
    assert _out(database, tmp_path, "--endpoint", "shipping", "--json") == "[]\n"
    with database.engine.connect() as connection:
        assert (
            connection.execute(sa.select(sa.func.count()).select_from(health.ENDPOINTS)).scalar()
            == 1
        )


@only("sqlite")
def test_endpoints_refuses_bad_input_in_one_line(database, tmp_path):
    result = sqlqueue("--url", database.url, "endpoints", "--state", "dead", cwd=tmp_path)
    assert result.returncode == 2
    assert "'dead'" in one_line(result.stderr)
    result = sqlqueue("--url", database.url, "endpoints", "--endpoint", " ", cwd=tmp_path)
    assert result.returncode == 2
    assert "' '" in one_line(result.stderr)


def test_endpoints_names_an_unreachable_database_in_one_line(tmp_path):
    with socket.socket() as probe:  # a port on loopback that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://someone:secret@127.0.0.1:{port}/shop"
    result = sqlqueue("--url", url, "endpoints", "--json", cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert f"127.0.0.1:{port}" in line and "refused" in line.lower() and "secret" not in line


def test_an_instance_shows_rates_only_once_it_beat_for_a_whole_minute():
    """A ``--once`` run of a second claims no pace per minute: its counts alone."""
    from sqlqueue_orm.cli import endpoints

    def instance(ran_for: float) -> health.EndpointInstance:
        return health.EndpointInstance(
            endpoint="billing", instance_id="i-1", host="h", process_id=1, state="stopped",
            started_at=1000.0, last_seen=1000.0 + ran_for, beat_interval=5.0, concurrency=1,
            in_flight=0, processed=3, failed=1, processed_rate=180.0, failed_rate=60.0,
            silent_for=0.0,
        )

    brief = endpoints.line(instance(1.0)).split("\t")
    assert brief[3:5] == ["processed 3", "failed 1"]
    whole = endpoints.line(instance(health.RATE_WINDOW)).split("\t")
    assert whole[3:5] == ["processed 3 (180.0/min)", "failed 1 (60.0/min)"]
