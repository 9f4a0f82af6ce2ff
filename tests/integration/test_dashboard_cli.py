"""``sqlqueue dashboard`` as a real subprocess, and the app mounted in another application."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from sqlqueue_orm import OutgoingMessage, cli
from sqlqueue_orm.sending.outbox import Outbox
from tests.conftest import only
from tests.integration.test_cli import one_line
from testsupport import browser

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


@only("sqlite", "postgresql")
def test_dashboard_serves_on_localhost_read_only_until_stopped(database):
    stop = signal.SIGINT if database.dialect == "sqlite" else signal.SIGTERM  # Ctrl+C, kill
    transport = database.transport()
    transport.create_queue("orders")
    transport.send("orders", OutgoingMessage(b"x"))
    env = {**os.environ, "SQLQUEUE_URL": database.url}
    process = subprocess.Popen(
        [sys.executable, "-m", "sqlqueue_orm.cli", "dashboard", "--port", "0",
         "--sample-interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "read-only" in line, line
        url = line.split(" on ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")  # this machine only, by default
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200
        assert 'data-queue="orders"' in page.text
        assert httpx.get(url + "outbox", timeout=30).status_code == 200
        assert httpx.post(url + "errors/delete", timeout=30).status_code == 403  # read-only
        # A DNS-rebinding page names its own host: refused before any page.
        rebound = httpx.get(url, headers={"Host": "evil.example:8800"}, timeout=30)
        assert rebound.status_code == 400 and "evil.example" in rebound.text
        named = httpx.get(url, headers={"Host": "localhost:8800"}, timeout=30)
        assert named.status_code == 200
    finally:
        process.send_signal(stop)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "stopped" in out
    assert "Traceback" not in err


def run(capsys, url, *args):  # type: ignore[no-untyped-def]
    """``sqlqueue --url URL ARGS`` in this process (fast: no interpreter start-up)."""
    status = cli.main(["--url", url, *args])
    return status, capsys.readouterr().err


def test_bad_port_and_port_in_use_are_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "q.db").touch()  # the database exists: only the port is wrong
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with pytest.raises(SystemExit) as exit_:  # argparse
        cli.main(["--url", url, "dashboard", "--port", "70000"])
    assert exit_.value.code == 2 and "'70000'" in one_line(capsys.readouterr().err)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        status, err = run(capsys, url, "dashboard", "--port", str(port))
    assert status == 2, err
    assert f"--port {port}" in one_line(err) and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_unreachable_database_is_one_line_naming_host_and_exit_1(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://someone:secret@127.0.0.1:{port}/shop"
    status, err = run(capsys, url, "dashboard", "--port", "0")
    assert status == 1, err
    line = one_line(err)
    assert f"127.0.0.1:{port}" in line and "refused" in line.lower() and "secret" not in line


@only("sqlite", "postgresql")
def test_mounted_under_a_prefix_links_stay_under_it(database):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from sqlqueue_orm.contrib.dashboard import create_app

    transport = database.transport()
    transport.create_queue("orders")
    dashboard = create_app(transport, allow_changes=True)
    host = Starlette(routes=[Mount("/ops/queues", app=dashboard)])
    with browser.served(host) as base:
        no_outbox = httpx.get(base + "/ops/queues/outbox")
        assert no_outbox.status_code == 200 and 'id="no-outbox"' in no_outbox.text
        assert "sqlqueue migrate" in no_outbox.text  # what to do about it
        Outbox(transport).create_table()
        page = httpx.get(base + "/ops/queues/")
        assert page.status_code == 200
        assert 'href="/ops/queues/queue?name=orders"' in page.text
        assert 'href="/ops/queues/outbox"' in page.text
        assert "path=/ops/queues;" in page.headers["set-cookie"].lower()
        assert httpx.get(base + "/ops/queues/queue?name=orders").status_code == 200
        assert httpx.get(base + "/ops/queues/outbox").status_code == 200
        assert httpx.get(base + "/ops/queues/queue?name=nowhere").status_code == 404
    dashboard.state.dashboard.close()
