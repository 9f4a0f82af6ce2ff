"""Flow control shared by every process on a queue (issue 17 item 2; docs/scale.md).

The limits are measured by the handlers: each records when it ran, and the test counts how many
of those intervals overlap. Several endpoint processes run at once on PostgreSQL; SQLite's
limits hold within one process, shown with two endpoints of one process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.conftest import only
from tests.endpoint_app import Job
from tests.flow_app import FlowBase, most_at_once, spans
from tests.outbox_app import REPO


def _processes(url: str, queue: str, count: int, concurrency: int, settings: dict[str, object],
               sleep: float) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.flow_app", url, queue, str(concurrency),
             json.dumps(settings), str(sleep)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(count)
    ]


def _until_spans(engine: sa.Engine, total: int, processes: list[subprocess.Popen[str]],
                 timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    try:
        while len(spans(engine)) < total:
            for process in processes:
                assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, f"{len(spans(engine))} of {total} handled"
            time.sleep(0.1)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


# -- the global concurrency limit ---------------------------------------------------------
@only("postgresql")
def test_global_concurrency_holds_across_processes(database):
    transport = database.transport()
    FlowBase.metadata.create_all(transport.engine)
    transport.create_queue("limited")
    total = 45
    transport.send_many("limited", [OutgoingMessage(Job(number=0)) for _ in range(total)])
    processes = _processes(database.url, "limited", 3, 4, {"global_concurrency": 3}, 0.05)
    _until_spans(transport.engine, total, processes)
    runs = spans(transport.engine)
    assert len({run.message_id for run in runs}) == total
    peak = most_at_once([(run.started, run.ended) for run in runs])
    assert 2 <= peak <= 3  # 3 processes x 4 workers, never more than 3 at once


@only("sqlite")
def test_global_concurrency_holds_across_endpoints_of_one_process_on_sqlite(database):
    transport = database.transport()
    transport.create_queue("limited")
    total = 40
    transport.send_many("limited", [OutgoingMessage(Job(number=0)) for _ in range(total)])
    lock = threading.Lock()
    now = peak = handled = 0

    def handle(job: Job, context: HandlerContext) -> None:
        nonlocal now, peak, handled
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.02)
        with lock:
            now -= 1
            handled += 1

    endpoints = []
    for _ in range(2):
        endpoint = Endpoint("limited", transport, concurrency=4, peek_delay=0.1,
                            transaction_mode=TransactionMode.NONE, global_concurrency=3,
                            delayed_delivery=False)
        endpoint.handle(Job, handle)
        endpoints.append(endpoint)
        endpoint.start()
    try:
        deadline = time.monotonic() + 60
        while handled < total:
            assert time.monotonic() < deadline, handled
            time.sleep(0.02)
    finally:
        for endpoint in endpoints:
            endpoint.stop(10)
    assert 2 <= peak <= 3


@only("postgresql")
def test_global_concurrency_refuses_mode_none_on_a_server(database):
    endpoint = Endpoint("refused", database.transport(), transaction_mode=TransactionMode.NONE,
                        global_concurrency=2)
    endpoint.handle(Job, lambda job, context: None)
    with pytest.raises(exceptions.ConfigurationError, match="cannot run in NONE"):
        endpoint.start()
    endpoint.stop(1)


def test_settings_validate_the_limits():
    with pytest.raises(exceptions.ConfigurationError, match="global_concurrency 0"):
        EndpointSettings(global_concurrency=0)
