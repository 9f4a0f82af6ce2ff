"""The README's headline table, generated from ``results/latest.json``.

``python -m benchmarks.headline`` prints it; the README holds exactly this text between its
``<!-- headline:start -->`` and ``<!-- headline:end -->`` markers (a test compares the two), so
the figures shown are always those of the latest run, with its command and machine.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

from benchmarks import bench_wakeup, report

LATEST = os.path.join(report.RESULTS, "latest.json")
DATABASES = (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))
OURS = "sqlqueue_orm"
PUMP = "sqlqueue_orm Endpoint pump"

#: The rows shown: (label, scenario, our side, the side our rate is divided by, or None).
ROWS = (
    ("send, 1 message per transaction", "send 1/txn", OURS, "raw autocommit"),
    ("send, 500 per transaction", "send 500/txn", OURS, "raw BEGIN/stmt/COMMIT"),
    ("receive, 1 per transaction", "receive 1/txn, 1 consumer(s)", OURS, "raw autocommit"),
    ("receive, 10 per transaction, 4 consumers", "receive 10/txn, 4 consumer(s)", OURS,
     "raw autocommit"),
    ("receive, 1,000,000 waiting", "receive 1/txn, 1,000,000 waiting", OURS, "raw autocommit"),
    ("unit of work with the outbox, 1 send", "unit of work, 1 send", f"{OURS} outbox", None),
    ("outbox dispatcher draining a backlog", "outbox dispatcher, backlog", OURS, None),
    ("endpoint, TRANSACTION_SCOPE, 4 workers", "endpoint TRANSACTION_SCOPE, concurrency 4", PUMP,
     "raw receive loop (same transactions)"),
    ("endpoint, batches of 100, empty handlers", "batched burn-down, empty handlers",
     f"{PUMP} (batch 100)", "raw batched loop (batch 100)"),
)
#: Latency rows: (label, scenario, side); shown as p50 / p99.
LATENCY_ROWS = (
    ("idle send-to-handler, NOTIFY", "idle send-to-handler", f"{OURS} NOTIFY (another writer)"),
    ("idle send-to-handler, same process", "idle send-to-handler",
     f"{OURS} in-process (same transport)"),
    ("idle send-to-handler, another process, default settings", bench_wakeup.IDLE,
     bench_wakeup.DEFAULT),
    (f"send-to-handler at {bench_wakeup.SUSTAINED_RATE} msg/s from another process, default "
     "settings", bench_wakeup.SUSTAINED, bench_wakeup.DEFAULT),
)
#: Send-rate rows: (label, scenario, our side, the side it is divided by); shown as a ratio.
SEND_RATE_ROWS = (
    (f"{bench_wakeup.SENDER_COUNT} concurrent senders, default wake-up vs no trigger",
     bench_wakeup.SENDERS, bench_wakeup.DEFAULT, bench_wakeup.NO_TRIGGER),
)
COMMAND = 'pip install -e ".[bench]" && python -m benchmarks'


def _cell(by_cell: dict[tuple[str, str, str], dict[str, Any]], database: str, scenario: str,
          side: str, base: str | None) -> str:
    ours = by_cell.get((database, scenario, side))
    if ours is None:
        return ""
    text = f"{ours['rate']:,.0f} msg/s"
    other = by_cell.get((database, scenario, base)) if base else None
    if other and other["rate"] > 0:
        text += f" ({ours['rate'] / other['rate']:.2f}x raw)"
    return text


def _latency(by_cell: dict[tuple[str, str, str], dict[str, Any]], database: str, scenario: str,
             side: str) -> str:
    ours = by_cell.get((database, scenario, side))
    if ours is None or ours.get("p50_ms") is None:
        return ""
    p95 = f"p95 {ours['p95_ms']:.1f} ms, " if ours.get("p95_ms") is not None else ""
    return f"p50 {ours['p50_ms']:.1f} ms, {p95}p99 {ours['p99_ms']:.1f} ms"


def _ratio(by_cell: dict[tuple[str, str, str], dict[str, Any]], database: str, scenario: str,
           side: str, base: str) -> str:
    ours, other = by_cell.get((database, scenario, side)), by_cell.get((database, scenario, base))
    if ours is None or other is None or not other["rate"]:
        return ""
    return (f"{ours['rate'] / other['rate']:.2f}x ({ours['rate']:,.0f} vs {other['rate']:,.0f} "
            "msg/s)")


def _command(document: dict[str, Any]) -> str:
    """The command of the run: :data:`COMMAND`, with ``--no-peers`` when it skipped the peers."""
    peers = document.get("settings", {}).get("peers", True)
    return COMMAND if peers else f"{COMMAND} --no-peers"


def headline(document: dict[str, Any]) -> str:
    """The README's figures from one run's JSON document (``latest.json``'s content)."""
    by_cell = {(r["database"], r["scenario"], r["side"]): r
               for r in document["results"] if not r.get("skipped")}
    finished = dt.datetime.strptime(document["finished"], "%Y%m%dT%H%M%SZ")
    minutes, seconds = divmod(round(document["seconds"]), 60)
    lines = [
        f"Measured {finished:%Y-%m-%d} at commit {document['commit']} on {document['cores']} "
        f"cores ({document['cpu']}), Python {document['python']}, 1-minute load "
        f"{document['load_average'][0]} at the start and {document['load_average_end'][0]} at "
        f"the end, in {minutes} min {seconds} s. Databases: "
        + "; ".join(document["databases"][name] for name, _ in DATABASES
                    if name in document["databases"])
        + f". Command: `{_command(document)}`. \"x raw\" is our rate divided by the raw driver "
        "running the "
        "same statements in the same run (above 1: faster).",
        "",
        "| | " + " | ".join(title for _, title in DATABASES) + " |",
        "|---|" + "---:|" * len(DATABASES),
    ]
    for label, scenario, side, base in ROWS:
        cells = [_cell(by_cell, name, scenario, side, base) for name, _ in DATABASES]
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, scenario, side in LATENCY_ROWS:
        cells = [_latency(by_cell, name, scenario, side) for name, _ in DATABASES]
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, scenario, side, base in SEND_RATE_ROWS:
        cells = [_ratio(by_cell, name, scenario, side, base) for name, _ in DATABASES]
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    with open(LATEST, encoding="utf-8") as latest:
        print(headline(json.load(latest)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
