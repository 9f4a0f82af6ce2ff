"""Hot path benchmark: sqlqueue_orm against the raw driver running the same SQL, side by side.

For each database (SQLite file; a throwaway PostgreSQL cluster, or $SQLQUEUE_BENCH_POSTGRES_URL)
it measures, in the same run and in rotating order, each path through our API beside the raw
DB-API driver doing the same work with the same SQL:

* ``send 1``: ``Transport.send`` without ``connection=`` vs one INSERT in autocommit (what a user
  writes by hand) and vs BEGIN/INSERT/COMMIT;
* ``send_many 500``: ``Transport.send_many`` of 500 vs ``executemany`` of 500 in one transaction,
  with its rows pre-built, and building them with the same NServiceBus headers (``+headers``);
* ``recv 1``: ``Transport.receive`` without ``connection=`` (at most once) vs one DELETE ...
  RETURNING in autocommit, and vs BEGIN/DELETE/COMMIT;
* ``recv 1 in tx``: ``receive(connection=...)`` in ``engine.begin()`` (at least once) vs
  BEGIN/DELETE/COMMIT;
* ``recv 10``: ``Transport.receive(max_messages=10)`` vs the same DELETE in autocommit.

The raw receive has its row limit written into the statement text, as one would write it by
hand, and parses each row's headers with the standard ``json.loads`` (as ours does: any consumer
of an NServiceBus row must), so a ratio measures our overhead, not the wire format. Every
receive checks that each message arrived exactly once. It prints messages/second
and the ratios ours/raw (target 0.9). Usage:
``python benchmarks/bench_hot_path.py [--n 2000] [--rounds 3] [--only sqlite|postgresql]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.queuing import sql

BATCH = 500


def _rate(n: int, function: Callable[[], None]) -> float:
    started = time.perf_counter()
    function()
    return n / (time.perf_counter() - started)


def _with_limit(template: str, limit: int) -> str:
    """The receive template with its row limit written in, as a user writes it by hand."""
    return re.sub(r"CAST\(:n AS bigint\)|:n\b", str(limit), template)


def _parsed(row: Any) -> Any:
    """A received row's native id, its headers parsed (id, seq, expired, headers, body)."""
    json.loads(row[3])
    return row[0]


class Raw:
    """The raw driver: one autocommit connection and one for explicit transactions."""

    def __init__(self, connect: Callable[[bool], Any], is_sqlite: bool) -> None:
        self.auto = connect(True)
        self.tx = connect(False)
        self.is_sqlite = is_sqlite

    def autocommit(self, statement: str, params: Any, fetch: bool) -> Any:
        cursor = self.auto.cursor()
        cursor.execute(statement, params)
        rows = cursor.fetchall() if fetch else None
        cursor.close()
        return rows

    def transaction(self, statement: str, params: Any, fetch: bool, many: bool = False) -> Any:
        connection = self.tx
        if self.is_sqlite:
            connection.execute("BEGIN IMMEDIATE")
        cursor = connection.cursor()
        if many:
            cursor.executemany(statement, params)
        else:
            cursor.execute(statement, params)
        rows = cursor.fetchall() if fetch else None
        cursor.close()
        connection.commit()
        return rows

    def close(self) -> None:
        self.auto.close()
        self.tx.close()


def _sends(
    transport: Transport, raw: Raw, send_sql: Any, messages: list[OutgoingMessage],
    rows: list[Any], to_driver: Callable[[Any], Any],
) -> list[tuple[str, Callable[[], None]]]:
    """Each side's sends of *messages*: ours, and the raw driver's of the same rows."""
    n = len(messages)

    def send_ours() -> None:
        for message in messages:
            transport.send("bench", message)

    def send_raw_auto() -> None:
        for row in rows:
            raw.autocommit(send_sql.text, row, False)

    def send_raw_tx() -> None:
        for row in rows:
            raw.transaction(send_sql.text, row, False)

    def send_many_ours() -> None:
        for start in range(0, n, BATCH):
            transport.send_many("bench", messages[start:start + BATCH])

    def send_many_raw() -> None:
        for start in range(0, n, BATCH):
            raw.transaction(send_sql.text, rows[start:start + BATCH], False, many=True)

    def send_many_raw_prepare() -> None:  # the raw side building the same headers
        for start in range(0, n, BATCH):
            built = [m.prepare() for m in messages[start:start + BATCH]]
            raw.transaction(send_sql.text, [
                send_sql.params({"id": to_driver(p.id), "ttbr": None, "headers": p.headers,
                                 "body": p.body}) for p in built
            ], False, many=True)

    return [
        ("send 1 ours", send_ours), ("send 1 raw auto", send_raw_auto),
        ("send 1 raw tx", send_raw_tx),
        ("send_many ours", send_many_ours), ("send_many raw tx", send_many_raw),
        ("send_many raw+headers", send_many_raw_prepare),
    ]


def _receives(transport: Transport, raw: Raw, receive_1: Any, receive_10: Any, n: int,
              check: Callable[[list[Any], int], None]) -> list[tuple[str, Callable[[], None]]]:
    """Each side's receives of *n* messages, one or ten at a time, checked by *check*."""

    def receiver(take: Callable[[], list[Any]], per_call: int) -> Callable[[], None]:
        def run() -> None:
            got: list[Any] = []
            for _ in range(n // per_call):
                got.extend(take())
            check(got, n // per_call * per_call)
        return run

    def ours_1() -> list[Any]:
        return [m.message_id for m in transport.receive("bench")]

    def ours_1_tx() -> list[Any]:
        with transport.engine.begin() as connection:
            return [m.message_id for m in transport.receive("bench", connection=connection)]

    def ours_10() -> list[Any]:
        return [m.message_id for m in transport.receive("bench", 10)]

    def raw_1_auto() -> list[Any]:
        return [_parsed(r) for r in raw.autocommit(receive_1.text, receive_1.params({}), True)]

    def raw_1_tx() -> list[Any]:
        return [_parsed(r) for r in raw.transaction(receive_1.text, receive_1.params({}), True)]

    def raw_10_auto() -> list[Any]:
        rows = raw.autocommit(receive_10.text, receive_10.params({}), True)
        return [_parsed(r) for r in rows]

    return [
        ("recv 1 ours", receiver(ours_1, 1)), ("recv 1 raw auto", receiver(raw_1_auto, 1)),
        ("recv 1 raw tx", receiver(raw_1_tx, 1)),
        ("recv 1 in tx ours", receiver(ours_1_tx, 1)),
        ("recv 10 ours", receiver(ours_10, 10)),
        ("recv 10 raw auto", receiver(raw_10_auto, 10)),
    ]


def _report(name: str, n: int, rounds: int, results: dict[str, list[float]]) -> None:
    """Each of our medians beside its raw baseline's, and their ratio."""
    print(f"\n{name} (n={n}, rounds={rounds}, 1 KB bodies, median msg/s)")
    for ours, baseline in (
        ("send 1 ours", "send 1 raw auto"), ("send 1 ours", "send 1 raw tx"),
        ("send_many ours", "send_many raw tx"), ("send_many ours", "send_many raw+headers"),
        ("recv 1 ours", "recv 1 raw auto"), ("recv 1 ours", "recv 1 raw tx"),
        ("recv 1 in tx ours", "recv 1 raw tx"),
        ("recv 10 ours", "recv 10 raw auto"),
    ):
        mine = statistics.median(results[ours])
        base = statistics.median(results[baseline])
        print(f"  {ours:>18} {mine:8.0f}  vs {baseline:>21} {base:8.0f}  ratio {mine / base:.2f}")


def bench(name: str, transport: Transport, raw: Raw, n: int, rounds: int) -> None:
    transport.create_queue("bench")
    queue = transport.queues.table_queue("bench")
    dialect = transport.engine.dialect
    send_sql = sql.render(queue._text.send, dialect, queue.quoted_table)
    receive_1 = sql.render(_with_limit(queue._text.receive, 1), dialect, queue.quoted_table)
    receive_10 = sql.render(_with_limit(queue._text.receive, 10), dialect, queue.quoted_table)
    to_driver = queue._text.id_to_driver
    results: dict[str, list[float]] = {}
    body = b"x" * 1024

    def fill(messages: list[OutgoingMessage]) -> None:
        transport.purge_all("bench")
        for start in range(0, len(messages), BATCH):
            transport.send_many("bench", messages[start:start + BATCH])

    def check(received: list[Any], expected: int) -> None:
        if len(received) != expected or len(set(received)) != expected:
            raise AssertionError(f"{name}: received {len(received)} ({len(set(received))} "
                                 f"distinct), expected {expected} exactly once")
        if transport.peek("bench") != 0:
            raise AssertionError(f"{name}: messages left over")

    # The same messages every round (each round starts on an empty queue).
    messages = [OutgoingMessage(body, headers={"NServiceBus.EnclosedMessageTypes":
                                               "Bench.Command, Bench",
                                               "NServiceBus.ContentType": "application/json"})
                for _ in range(n)]
    prepared = [m.prepare() for m in messages]
    rows = [send_sql.params({"id": to_driver(p.id), "ttbr": None, "headers": p.headers,
                             "body": p.body}) for p in prepared]
    for round_number in range(rounds):
        sends = _sends(transport, raw, send_sql, messages, rows, to_driver)
        receives = _receives(transport, raw, receive_1, receive_10, n, check)
        shift = round_number % len(sends)  # rotate the order: no side always runs first
        for label, function in sends[shift:] + sends[:shift]:
            transport.purge_all("bench")
            results.setdefault(label, []).append(_rate(n, function))
        shift = round_number % len(receives)
        for label, function in receives[shift:] + receives[:shift]:
            fill(messages)
            results.setdefault(label, []).append(_rate(n, function))
    raw.close()
    _report(name, n, rounds, results)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    args = parser.parse_args()
    if args.only != "postgresql":
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "bench.db")
            transport = Transport(f"sqlite:///{path}")

            def sqlite_raw(_autocommit: bool) -> sqlite3.Connection:
                connection = sqlite3.connect(path, isolation_level=None, timeout=30)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                return connection

            bench("SQLite (WAL, synchronous=NORMAL)", transport, Raw(sqlite_raw, True), args.n,
                  args.rounds)
            transport.close()
    if args.only == "sqlite":
        return
    url = os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL")
    if not url:
        from testsupport import pg_cluster

        url = pg_cluster.start().url()
    transport = Transport(url)
    raw_url = url.replace("postgresql+psycopg://", "postgresql://")
    bench("PostgreSQL (psycopg 3, loopback TCP)", transport,
          Raw(lambda autocommit: psycopg.connect(raw_url, autocommit=autocommit), False),
          args.n, args.rounds)
    transport.close()


if __name__ == "__main__":
    main()
