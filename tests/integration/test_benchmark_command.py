"""Smoke test of ``python -m benchmarks``: tiny sizes on SQLite, every scenario, no timing asserted.

It proves the command runs end to end (forked consumers, the exactly-once checks, the raw
baseline built from TableQueue's rendered statements, the migration through the CLI) and prints
the table; the figures themselves are only ever read by people. The wake-up cells also run on
PostgreSQL, where they install and remove the trigger.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

from benchmarks import baselines, bench_wakeup, headline, servers, workers, workload
from sqlqueue_orm import OutgoingMessage, Transport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The wake-up scenario at its smallest: a few idle messages, short rounds.
TINY_WAKEUP = ["--wakeup-samples", "3", "--wakeup-seconds", "0.2", "--sender-rounds", "1",
               "--sender-seconds", "0.2"]
WAKEUP_CELLS = (bench_wakeup.IDLE, bench_wakeup.SUSTAINED, bench_wakeup.SENDERS)


def _assert_wakeup_cells(table: str, database: str) -> None:
    """The three cells measured, each with its target, and printed beside the others."""
    for scenario in WAKEUP_CELLS:
        row = f"| {database} | {scenario} | {bench_wakeup.DEFAULT} |"
        assert table.count(row) >= 3, (scenario, table)  # results, targets block, comparison
    assert f"| {database} | {bench_wakeup.SENDERS} | {bench_wakeup.NO_TRIGGER} |" in table
    assert "Wake-up, beside the cells it must not slow" in table


@pytest.mark.timeout(360)  # every scenario of the benchmark, small, in one process
def test_every_scenario_runs_on_sqlite_and_prints_the_table():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--databases", "sqlite", "--messages", "20",
         "--deep", "200", "--migrate-rows", "200", "--failed-messages", "200", "--no-peers",
         "--cli-rounds", "1", "--no-write", *TINY_WAKEUP],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    table = completed.stdout
    assert "failed:" not in table, table
    for scenario in ("send 1/txn", "send 20/txn", "receive 10/txn, 4 consumer(s)",
                     "unit of work, 1 send", "outbox dispatcher, backlog", "peek, 200 waiting",
                     "receive 1/txn, 200 waiting", "migrate v1 table, 200 rows",
                     "send 1/txn, instrumentation", "receive 1/call, instrumentation",
                     "error queue, 200 failed in 20 groups", "CLI start-up, one process"):
        assert f"| sqlite | {scenario} |" in table, scenario
    assert "| raw autocommit |" in table and "| raw BEGIN/stmt/COMMIT |" in table
    assert "| sqlqueue_orm in transport.begin() |" in table  # beside engine.begin()'s
    for mode in ("NONE", "TRANSACTION_SCOPE"):  # the modes SQLite runs
        for concurrency in (1, 4):
            scenario = f"endpoint {mode}, concurrency {concurrency}"
            for side in ("sqlqueue_orm Endpoint pump", "raw receive loop (same transactions)"):
                assert f"| sqlite | {scenario} | {side} |" in table, (scenario, side)
            assert f"| sqlite | {scenario}: pump ÷ raw receive loop |" in table
    for side in ("polling (peek delay 1 s)", "in-process (same transport)"):
        assert f"| sqlite | idle send-to-handler | sqlqueue_orm {side} |" in table, side
    _assert_wakeup_cells(table, "sqlite")
    assert (f"| sqlite | {bench_wakeup.SENDERS} | {bench_wakeup.UNCONDITIONAL} | skipped: this "
            "database has no NOTIFY trigger |") in table


def test_the_wakeup_cells_run_on_postgresql(postgres_admin_url):
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--databases", "postgresql", "--only", "wakeup",
         "--no-write", *TINY_WAKEUP],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "SQLQUEUE_BENCH_POSTGRES_URL": postgres_admin_url},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    table = completed.stdout
    assert "failed:" not in table, table
    _assert_wakeup_cells(table, "postgresql")
    old = f"| postgresql | {bench_wakeup.SENDERS} | {bench_wakeup.UNCONDITIONAL} |"
    if bench_wakeup.old_trigger_selectable():  # notify=True is the old trigger: measured
        assert f"{old} skipped" not in table and old in table
    else:
        assert f"{old} skipped: notify=True installs the default's trigger now" in table
    assert "(no pump or batched burn-down cell in this run" in table


def test_the_headline_shows_the_wakeup_rows():
    def cell(scenario: str, side: str, rate: int, latencies: list[float]) -> dict[str, object]:
        timing = workload.Timing(rate, 1.0, latencies)
        return dataclasses.asdict(workload.Result.of("postgresql", scenario, side, timing))

    document = {
        "finished": "20260101T000000Z", "seconds": 61, "commit": "abc1234", "cores": 2,
        "cpu": "cpu", "python": "3.12", "load_average": [0.1], "load_average_end": [0.2],
        "databases": {"postgresql": "PostgreSQL"},
        "results": [
            cell(bench_wakeup.IDLE, bench_wakeup.DEFAULT, 9, [0.001, 0.002, 0.003]),
            cell(bench_wakeup.SUSTAINED, bench_wakeup.DEFAULT, 300, [0.004, 0.005, 0.006]),
            cell(bench_wakeup.SENDERS, bench_wakeup.DEFAULT, 9_900, []),
            cell(bench_wakeup.SENDERS, bench_wakeup.NO_TRIGGER, 10_000, []),
        ],
    }
    text = headline.headline(document)
    rows = set(text.splitlines())
    for row in (
        "| idle send-to-handler, another process, default settings |  | p50 2.0 ms, p95 3.0 ms, "
        "p99 3.0 ms |",
        "| send-to-handler at 300 msg/s from another process, default settings |  | p50 5.0 ms, "
        "p95 6.0 ms, p99 6.0 ms |",
        "| 4 concurrent senders, default wake-up vs no trigger |  | 0.99x (9,900 vs 10,000 "
        "msg/s) |",
    ):
        assert row in rows, text


def test_a_bad_scenario_name_is_named_and_exits_2():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "recieve"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 2
    assert "recieve" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_the_cpu_cost_command_prints_every_path_beside_raw():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_cost", "--databases", "sqlite", "--messages",
         "20", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    for path in ("send ours", "recv ours", "recv in tx ours", "recv in begin ours",
                 "send in tx ours", "send 500 ours", "send 500 raw", "prepare only"):
        assert path in completed.stdout, completed.stdout
    assert completed.stdout.count("ours - raw") == 6


def test_the_raw_send_stores_byte_for_byte_the_headers_ours_stores(tmp_path):
    """The raw loop builds its rows itself (json module), in the format prepare() writes."""
    database = servers.sqlite(str(tmp_path))
    given = {**workload.NSB_HEADERS, "a/b": "\u00fc\n\"\\", "none": None}
    messages = [OutgoingMessage(workload.body(number), headers=given, message_id=f"m/{number}")
                for number in range(3)]
    with Transport(database.url) as transport:
        for queue in ("raw", "ours"):
            transport.create_queue(queue)
        raw = baselines.RawQueue(database, "raw", autocommit=False)
        raw.send_messages(messages)
        raw.close()
        transport.send_many("ours", [dataclasses.replace(item, id=uuid.uuid4())
                                     for item in messages])
        stored = {queue: [(_without_time_sent(message.raw_headers), message.body)
                          for message in transport.browse(queue, 10)]
                  for queue in ("raw", "ours")}
    assert stored["raw"] == stored["ours"]
    assert len(stored["raw"]) == 3 and '"a\\/b":"\u00fc\\n\\"\\\\"' in stored["raw"][0][0]


def _without_time_sent(text: str | bytes) -> str:
    assert isinstance(text, str)
    return re.sub(r'"NServiceBus\.TimeSent":"[^"]*"', '"NServiceBus.TimeSent":""', text)


def test_the_compare_command_sets_another_library_beside_this_one():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "--before", str(ROOT), "--runs", "1",
         "--rounds", "1", "--messages", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    for path in ("recv ours (ours)", "recv ours - raw", "recv in begin ours - raw"):
        assert f"SQLite       {path}" in completed.stdout, completed.stdout


def test_the_raw_receive_in_a_transaction_parses_before_it_commits(tmp_path):
    """As ours builds its messages in the caller's transaction: a row whose headers do not
    parse is not taken (the transaction never commits), so the write lock is held as long."""
    database = servers.sqlite(str(tmp_path))
    with Transport(database.url) as transport:
        transport.create_queue("raw")
        raw = baselines.RawQueue(database, "raw", autocommit=False)
        transport.send("raw", OutgoingMessage(b"x"))
        with transport.engine.begin() as connection:
            connection.exec_driver_sql('UPDATE "raw" SET "Headers" = \'not json\'')
        try:
            raw.receive(1)
        except ValueError:
            pass
        else:
            raise AssertionError("headers that are not JSON parsed")
        raw.close()  # closing with the transaction open rolls it back
        assert transport.peek("raw") == 1


def test_a_receive_side_is_its_median_round():
    rounds = [workload.Timing(100, seconds, [seconds]) for seconds in (1.0, 4.0, 2.0, 3.0)]
    chosen = workload.median_round(rounds)
    assert (chosen.messages, chosen.seconds) == (100, 3.0)  # rates 100, 25, 50, 33: lower middle
    assert sorted(chosen.latencies) == [1.0, 2.0, 3.0, 4.0]


def test_a_consumer_looks_its_queue_up_before_the_clock_starts(tmp_path):
    """The first use of a queue (the catalog look-up of its columns and indexes) is not timed:
    the raw loop probes before its clock too, and four consumers looking the table up at once
    took tens of milliseconds of a cell of a few hundred."""
    database = servers.sqlite(str(tmp_path))
    with Transport(database.url) as transport:
        transport.create_queue("q")
        transport.send_many("q", workload.outgoing(0, 3))
    statements: list[str] = []

    def traced(dbapi_connection, _record):
        dbapi_connection.set_trace_callback(statements.append)

    sa.event.listen(sa.pool.Pool, "connect", traced)
    try:
        for side in (workers.OURS, workers.OURS_TX, workers.OURS_KEPT):
            receive, close = workers._receiver(side, database, "q", 1)
            statements.clear()
            assert len(receive()) == 1
            close()
            assert statements, side
            assert not [text for text in statements if "PRAGMA" in text.upper()], (side, statements)
    finally:
        sa.event.remove(sa.pool.Pool, "connect", traced)
