"""``sqlqueue dashboard`` as a real subprocess, and the app mounted in another application."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.sending.outbox import Outbox
from tests import browser
from tests.conftest import only
from tests.integration.test_cli import one_line, sqlqueue

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
    finally:
        process.send_signal(stop)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "stopped" in out
    assert "Traceback" not in err


def test_bad_port_and_port_in_use_are_one_line_and_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'q.db'}"
    result = sqlqueue(url, "dashboard", "--port", "70000", check=False)
    assert result.returncode == 2 and "'70000'" in one_line(result.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = sqlqueue(url, "dashboard", "--port", str(port), check=False)
    assert result.returncode == 2, result.stderr
    assert f"--port {port}" in one_line(result.stderr) and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_database_is_one_line_naming_host_and_exit_1():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg://someone:secret@127.0.0.1:{port}/shop"
    result = sqlqueue(url, "dashboard", "--port", "0", check=False)
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    assert f"127.0.0.1:{port}" in line and "refused" in line.lower() and "secret" not in line


@only("sqlite", "postgresql")
def test_mounted_under_a_prefix_links_stay_under_it(database):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from sqlqueue_orm.contrib.dashboard import create_app

    transport = database.transport()
    transport.create_queue("orders")
    Outbox(transport).create_table()
    dashboard = create_app(transport, allow_changes=True)
    host = Starlette(routes=[Mount("/ops/queues", app=dashboard)])
    with browser.served(host) as base:
        page = httpx.get(base + "/ops/queues/")
        assert page.status_code == 200
        assert 'href="/ops/queues/queue?name=orders"' in page.text
        assert 'href="/ops/queues/outbox"' in page.text
        assert "path=/ops/queues;" in page.headers["set-cookie"].lower()
        assert httpx.get(base + "/ops/queues/queue?name=orders").status_code == 200
        assert httpx.get(base + "/ops/queues/outbox").status_code == 200
        assert httpx.get(base + "/ops/queues/queue?name=nowhere").status_code == 404
    dashboard.state.dashboard.close()
