"""``sqlqueue run MODULE:ENDPOINT``: drains a queue with --once and prints its rate; bad input."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import only
from tests.endpoint_app import send_jobs
from tests.outbox_app import REPO, sqlqueue_command


def sqlqueue(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*sqlqueue_command(), *args], capture_output=True, text=True, timeout=300, env=env,
        cwd=REPO, check=False,
    )


@only("sqlite", "postgresql")
def test_run_once_drains_the_queue_and_prints_the_rate(database):
    transport = database.transport()
    transport.create_queue("jobs")
    send_jobs(transport, "jobs", 500)
    result = sqlqueue(
        "--url", database.url, "run", "tests.endpoint_app:endpoint", "--once", "--concurrency", "2"
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("queue jobs: received 500 message(s) in ")
    assert "msg/s): handled 500, failed 0" in line
    assert transport.peek("jobs") == 0


@only("sqlite")
def test_run_names_a_bad_endpoint_in_one_line_and_exits_2(database):
    for reference, expected in (
        ("no_colon", "'no_colon' is not MODULE:ENDPOINT"),
        ("tests.no_such_module:endpoint", "cannot import module 'tests.no_such_module'"),
        ("tests.endpoint_app:nothing", "module 'tests.endpoint_app' has no 'nothing'"),
        ("tests.endpoint_app:Job", "'tests.endpoint_app:Job' is neither an Endpoint"),
    ):
        result = sqlqueue("--url", database.url, "run", reference, "--once")
        assert result.returncode == 2, (reference, result.stderr)
        [line] = result.stderr.splitlines()
        assert expected in line, line
    result = sqlqueue("--url", database.url, "run", "tests.endpoint_app:endpoint",
                      "--concurrency", "0")
    assert result.returncode == 2
    assert "'0' must be from 1 to 1000" in result.stderr
