"""``sqlqueue control`` as a user runs it: across endpoint processes, and its bad input.

Two endpoint processes (tests/endpoint_app.py) on one queue: ``control pause`` from the command
line stops both (each says so), messages sent meanwhile wait in the queue, ``control resume``
starts both again and every message is handled once. A shrink under a backlog takes effect
within a second in both (each worker too many ends after its message), and from the shrink
through the grow back the handlers running at once in a process, as the handlers record them,
never exceed the limit of the moment. Bad input (a concurrency of 0 or not a
number, an endpoint never paused, an unknown one) is one line naming the value and exit status
2; an unreachable database is one line naming host and cause, exit status 1.
"""

from __future__ import annotations

import collections
import json
import queue as queue_module
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlqueue_orm import cli, control
from sqlqueue_orm.receiving import TransactionMode
from sqlqueue_orm.receiving import control as receiving_control
from tests.conftest import only
from tests.endpoint_app import UserBase, handled_ids, send_jobs
from tests.integration.cli_process import one_line, sqlqueue

#: Seconds a wait for an endpoint process's line, or for its handled rows, may take before the
#: test fails: a guard against a hang, not a bound the test asserts. Two processes starting at
#: once each import SQLAlchemy, pydantic and the package, which on two cores other test runs
#: share takes many seconds before the first line.
PATIENCE = 120.0


class EndpointProcess:
    """``python -m tests.endpoint_app`` with its stdout lines read on a thread (waits time out)."""

    def __init__(
        self,
        url: str,
        queue: str,
        mode: TransactionMode = TransactionMode.TRANSACTION_SCOPE,
        concurrency: int = 2,
        seconds: float = 0.02,
        record: Path | None = None,
    ) -> None:
        command = [
            sys.executable,
            "-m",
            "tests.endpoint_app",
            url,
            queue,
            mode.value,
            str(concurrency),
            str(seconds),
            "10",
            *([] if record is None else [str(record)]),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue_module.Queue[str] = queue_module.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float = PATIENCE) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {prefix!r} line from process {self.process.pid}"
            try:
                line = self.lines.get(timeout=left)
            except queue_module.Empty:
                continue
            if line.startswith(prefix):
                return line

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        _out, err = self.process.communicate(timeout=30)
        return err


def _handled(url: str) -> list[str]:
    return handled_ids(sa.create_engine(url, poolclass=sa.pool.NullPool))


def _wait_handled(url: str, count: int, timeout: float = PATIENCE) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(found := _handled(url)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} handled"
        time.sleep(0.05)
    return found


@only("sqlite", "postgresql")
def test_pause_from_the_cli_stops_both_processes_and_resume_loses_nothing(database, tmp_path):
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    transport.create_queue("error")
    processes = [EndpointProcess(database.url, "jobs") for _ in range(2)]
    try:
        for each in processes:
            each.wait_for("started")
        first = send_jobs(transport, "jobs", 10)
        _wait_handled(database.url, 10)

        paused = sqlqueue("control", "pause", "jobs", "--url", database.url, cwd=tmp_path)
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("paused jobs")
        for each in processes:
            assert "changed by" in each.wait_for("queue jobs: paused")
        waiting = send_jobs(transport, "jobs", 6)
        time.sleep(3 * receiving_control.POLL_INTERVAL)  # both paused: nothing is taken
        assert len(_handled(database.url)) == 10
        assert transport.peek("jobs") == 6

        resumed = sqlqueue("control", "resume", "jobs", "--url", database.url, cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        for each in processes:
            each.wait_for("queue jobs: resumed")
        handled = _wait_handled(database.url, 16)
    finally:
        errors = [each.stop() for each in processes]
    assert all(each.process.returncode == 0 for each in processes), errors
    assert collections.Counter(handled) == collections.Counter([*first, *waiting])
    assert transport.peek("jobs") == 0
    shown = sqlqueue("control", "log", "jobs", "--json", "--url", database.url, cwd=tmp_path)
    assert [json.loads(line)["action"] for line in shown.stdout.splitlines()] == ["resume", "pause"]


def _at_once(record: Path) -> list[tuple[float, int]]:
    """The handlers running at once in one process after each start and end it recorded."""
    events = sorted(
        (float(at), kind == "start")  # at one instant an end counts before a start
        for kind, at in (line.split() for line in record.read_text().splitlines())
    )
    running, steps = 0, []
    for at, started in events:
        running += 1 if started else -1
        steps.append((at, running))
    return steps


def _most_at_once(steps: list[tuple[float, int]], since: float, until: float) -> int:
    """The most handlers that ran at once at any instant from *since* to *until*."""
    before = [running for at, running in steps if at <= since]
    within = [running for at, running in steps if since < at <= until]
    return max([*before[-1:], *within], default=0)


@pytest.mark.slow
@only("sqlite", "postgresql")
def test_a_resize_under_a_backlog_applies_within_a_second_and_never_exceeds_the_limit(
    database, tmp_path
):
    """Two processes of concurrency 4, a backlog, handlers of 0.3 s: ``control concurrency 1``
    leaves one handler at a time in each within a second (the 0.5 s read plus the message in
    flight), and ``default`` grows them back without more than 4 at once at any instant."""
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    transport.create_queue("error")
    # SQLite has one writer: a transactional handler holds the write lock, so only NONE
    # runs handlers at once there
    mode = TransactionMode.TRANSACTION_SCOPE
    if database.dialect == "sqlite":
        mode = TransactionMode.NONE
    records = [tmp_path / f"handlers-{number}.txt" for number in range(2)]
    processes = [
        EndpointProcess(database.url, "jobs", mode, 4, 0.3, record) for record in records
    ]
    try:
        for each in processes:
            each.wait_for("started")
        # more than 8 workers at 0.3 s a message handle in the time observed
        sent = send_jobs(transport, "jobs", 240)
        _wait_handled(database.url, 8)

        shrunk = sqlqueue("control", "concurrency", "jobs", "1", "--url", database.url,
                          cwd=tmp_path)
        assert shrunk.returncode == 0, shrunk.stderr
        shrink = time.monotonic()  # the row is written: each process reads it within 0.5 s
        for each in processes:
            each.wait_for("queue jobs: concurrency 4 -> 1")
        time.sleep(max(0.0, shrink + 3.5 - time.monotonic()))

        grow = time.monotonic()
        grown = sqlqueue("control", "concurrency", "jobs", "default", "--url", database.url,
                         cwd=tmp_path)
        assert grown.returncode == 0, grown.stderr
        for each in processes:
            each.wait_for("queue jobs: concurrency 1 -> 4")
        grown_at = time.monotonic()
        handled = _wait_handled(database.url, len(sent))
    finally:
        errors = [each.stop() for each in processes]
    assert all(each.process.returncode == 0 for each in processes), errors
    assert collections.Counter(handled) == collections.Counter(sent)  # none lost, none twice
    steps = [_at_once(record) for record in records]
    end = time.monotonic()
    # a second and a half after the row was written (a loaded machine's margin on the 0.5 s
    # read and the 0.3 s message each retiring worker finishes), one at a time in each
    shrunk_to = [_most_at_once(each, shrink + 1.5, grow) for each in steps]
    assert all(most <= 1 for most in shrunk_to), shrunk_to
    assert sum(shrink + 1.5 < at < grow for each in steps for at, _ in each) > 0  # it went on
    # the limit holds at every instant: through the shrink and while growing back
    most = [_most_at_once(each, 0.0, end) for each in steps]
    assert all(each <= 4 for each in most), most
    assert max(_most_at_once(each, grown_at + 1.0, end) for each in steps) > 1  # it grew back


@only("sqlite", "postgresql")
def test_bad_input_is_one_line_naming_the_value_and_exit_2(database, tmp_path):
    database.transport().create_queue("jobs")
    cases = [
        (["control", "concurrency", "jobs", "0"], "'0'"),
        (["control", "concurrency", "jobs", "four"], "'four'"),
        (["control", "resume", "jobs"], "'jobs'"),  # never paused
    ]
    for args, named in cases:
        result = sqlqueue(*args, "--url", database.url, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert named in one_line(result.stderr), (args, result.stderr)
    assert control.log(database.transport()) == []  # nothing was changed


@only("sqlite", "postgresql")
def test_show_and_log(database, capsys):
    url = database.url
    database.transport().create_queue("jobs")

    def run(*args: str) -> tuple[int, str, str]:
        status = cli.main([*args, "--url", url])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    status, out, _err = run("control", "show", "jobs")
    assert status == 0 and "never changed" in out
    for args, named in [
        (["control", "concurrency", "jobs", "1001"], "'1001'"),
        (["control", "resume", "nope"], "'nope'"),
        (["control", "pause", "nope"], "'nope'"),
        (["control", "show", "nope"], "'nope'"),
    ]:
        try:
            status, _out, err = run(*args)
        except SystemExit as exit_:  # argparse's own refusal
            status, err = int(exit_.code or 0), capsys.readouterr().err
        assert status == 2 and named in one_line(err), (args, err)
    assert run("control", "log", "--json")[1].strip() == "[]"

    assert run("control", "concurrency", "jobs", "3")[0] == 0
    assert run("control", "pause", "jobs")[0] == 0
    [state] = [json.loads(line) for line in run("control", "show", "--json")[1].splitlines()]
    assert (state["endpoint"], state["paused"], state["concurrency"]) == ("jobs", True, 3)
    assert run("control", "concurrency", "jobs", "default")[0] == 0
    lines = run("control", "log")[1].splitlines()
    assert [line.split("  ")[2] for line in lines] == [
        "concurrency default",
        "pause",
        "concurrency 3",
    ]
    assert all(" by " in line and "@" in line for line in lines)


def test_an_unreachable_database_is_one_line_naming_the_host(tmp_path):
    with socket.socket() as probe:  # a port on loopback that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://someone:secret@127.0.0.1:{port}/shop"
    for args in (["control", "pause", "jobs"],):
        result = sqlqueue(*args, "--url", url, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        line = one_line(result.stderr)
        assert f"127.0.0.1:{port}" in line and "secret" not in line, line
