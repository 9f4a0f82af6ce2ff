"""Smoke test of ``python -m benchmarks``: tiny sizes on SQLite, every scenario, no timing asserted.

It proves the command runs end to end (forked consumers, the exactly-once checks, the raw
baseline built from TableQueue's rendered statements, the migration through the CLI) and prints
the table; the figures themselves are only ever read by people.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import uuid

from benchmarks import baselines, servers, workload
from sqlqueue_orm import OutgoingMessage, Transport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_scenario_runs_on_sqlite_and_prints_the_table():
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--databases", "sqlite", "--messages", "20",
         "--deep", "200", "--migrate-rows", "200", "--no-peers", "--no-write"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    table = completed.stdout
    assert "failed:" not in table, table
    for scenario in ("send 1/txn", "send 20/txn", "receive 10/txn, 4 consumer(s)",
                     "unit of work, 1 send", "outbox dispatcher, backlog", "peek, 200 waiting",
                     "receive 1/txn, 200 waiting", "migrate v1 table, 200 rows",
                     "send 1/txn, instrumentation", "receive 1/call, instrumentation"):
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
    for path in ("send ours", "recv ours", "recv in tx ours", "send in tx ours", "send 500 ours",
                 "send 500 raw", "prepare only"):
        assert path in completed.stdout, completed.stdout
    assert completed.stdout.count("ours - raw") == 5


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
