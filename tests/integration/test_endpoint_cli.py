"""``sqlqueue run MODULE:ENDPOINT``: drains a queue with --once and prints its rate; bad input."""

from __future__ import annotations

import os
import subprocess
import threading

from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint
from tests.conftest import only
from tests.endpoint_app import Job, send_jobs
from testsupport.outbox_app import REPO, sqlqueue_command


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
    assert line.startswith("queue jobs: 500 message(s) in ")
    assert "msg/s): handled 500, failed 0" in line
    assert transport.peek("jobs") == 0


class EmptyEstimate(Transport):
    """Its peek reports an empty queue whatever the table holds.

    A peek is an estimate: SQL Server's skips rows other receivers hold (READPAST), which
    their rollback returns; a count from statistics lags. Receives and handling are real.
    """

    def peek(self, queue, connection=None):  # type: ignore[no-untyped-def]
        return 0


def test_run_once_is_not_stopped_by_an_empty_estimate_while_rows_remain(database):
    transport = EmptyEstimate(database.engine)
    transport.create_queue("jobs")
    send_jobs(transport, "jobs", 30)
    endpoint = Endpoint("jobs", transport, peek_delay=0.1, concurrency=2)
    handled: list[int] = []
    endpoint.handle(Job, lambda job, context: handled.append(job.number))
    runner = threading.Thread(target=endpoint.run, kwargs={"once": True}, daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive()
    assert sorted(handled) == list(range(30))
    assert Transport.peek(transport, "jobs") == 0


def test_run_once_ends_when_stopped_before_the_queue_is_drained(database):
    """SIGTERM (a stop) during ``--once`` ends the run; what was not handled stays queued."""
    transport = database.transport()
    transport.create_queue("jobs")
    send_jobs(transport, "jobs", 40)
    endpoint = Endpoint("jobs", transport, peek_delay=0.1, concurrency=1)
    handled: list[int] = []
    started, release = threading.Event(), threading.Event()

    @endpoint.handle(Job)
    def handle(job: Job, context: object) -> None:
        handled.append(job.number)
        started.set()
        release.wait(10)  # the first handler is still running when the stop comes

    runner = threading.Thread(target=endpoint.run, kwargs={"once": True}, daemon=True)
    runner.start()
    assert started.wait(30)
    threading.Timer(0.3, release.set).start()
    assert endpoint.stop(10)  # takes no more messages; lets the running one finish
    runner.join(10)
    assert not runner.is_alive()
    assert len(handled) == 1
    assert len(transport.browse("jobs", 100)) == 40 - len(handled)


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
