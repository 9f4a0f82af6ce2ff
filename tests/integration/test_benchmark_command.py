"""Smoke test of ``python -m benchmarks``: tiny sizes on SQLite, every scenario, no timing asserted.

It proves the command runs end to end (forked consumers, the exactly-once checks, the raw
baseline built from TableQueue's rendered statements, the migration through the CLI) and prints
the table; the figures themselves are only ever read by people.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_scenario_runs_on_sqlite_and_prints_the_table():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--databases", "sqlite", "--messages", "20",
         "--deep", "200", "--migrate-rows", "200", "--failed-messages", "200", "--no-peers",
         "--no-write"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    table = completed.stdout
    assert "failed:" not in table, table
    for scenario in ("send 1/txn", "send 20/txn", "receive 10/txn, 4 consumer(s)",
                     "unit of work, 1 send", "outbox dispatcher, backlog", "peek, 200 waiting",
                     "receive 1/txn, 200 waiting", "migrate v1 table, 200 rows",
                     "send 1/txn, instrumentation", "receive 1/call, instrumentation",
                     "error queue, 200 failed in 20 groups"):
        assert f"| sqlite | {scenario} |" in table, scenario
    assert "| raw autocommit |" in table and "| raw BEGIN/stmt/COMMIT |" in table
    for mode in ("NONE", "TRANSACTION_SCOPE"):  # the modes SQLite runs
        for concurrency in (1, 4):
            scenario = f"endpoint {mode}, concurrency {concurrency}"
            for side in ("sqlqueue_orm Endpoint pump", "raw receive loop (same transactions)"):
                assert f"| sqlite | {scenario} | {side} |" in table, (scenario, side)
            assert f"| sqlite | {scenario}: pump ÷ raw receive loop |" in table
    for side in ("polling (peek delay 1 s)", "in-process (same transport)"):
        assert f"| sqlite | idle send-to-handler | sqlqueue_orm {side} |" in table, side


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
    for path in ("send ours", "recv ours", "recv in tx ours", "send in tx ours", "prepare only"):
        assert path in completed.stdout, completed.stdout
    assert completed.stdout.count("ours - raw") == 4
