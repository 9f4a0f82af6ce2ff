"""Hot path benchmark: sqlqueue_orm against the raw driver running the same SQL, side by side.

For each database (SQLite file; a throwaway PostgreSQL cluster, or $SQLQUEUE_BENCH_POSTGRES_URL)
it measures, in the same run and alternating rounds:

* send: one message per transaction, through ``Transport.send`` vs the DB-API driver executing
  the identical INSERT with the same parameter values (the raw side gets its rows pre-built, so
  the ratio also charges us for building the NServiceBus headers);
* receive: one message per transaction, ``Transport.receive`` vs the identical DELETE ... RETURNING.

It prints messages/second and the ratio ours/raw (aim: 0.85 or better). Usage:
``python benchmarks/bench_hot_path.py [--n 2000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg

from sqlqueue_orm import OutgoingMessage, Transport


def _rate(n: int, function: Callable[[], None]) -> float:
    started = time.perf_counter()
    function()
    return n / (time.perf_counter() - started)


def bench(name: str, transport: Transport, raw_connect: Callable[[], object], n: int,
          rounds: int) -> None:
    transport.create_queue("bench")
    queue = transport.queue("bench")
    send_sql, receive_sql = queue._send, queue._receive
    to_driver = queue._text.id_to_driver
    results: dict[str, list[float]] = {"send ours": [], "send raw": [], "recv ours": [],
                                       "recv raw": [], "send raw+headers": []}
    raw = raw_connect()
    is_sqlite = isinstance(raw, sqlite3.Connection)

    def raw_tx(statement: str, params: object, fetch: bool) -> None:
        if is_sqlite:
            raw.execute("BEGIN IMMEDIATE")  # type: ignore[attr-defined]
            cursor = raw.execute(statement, params)  # type: ignore[attr-defined]
            if fetch:
                cursor.fetchall()
            raw.execute("COMMIT")  # type: ignore[attr-defined]
        else:
            with raw.cursor() as cursor:  # type: ignore[attr-defined]
                cursor.execute(statement, params)
                if fetch:
                    cursor.fetchall()
            raw.commit()  # type: ignore[attr-defined]

    for round_number in range(rounds):
        transport.purge_all("bench")
        messages = [OutgoingMessage(b"payload-%d" % i) for i in range(n)]
        prepared = [m.prepare() for m in messages]
        rows = [send_sql.params({"id": to_driver(p.id), "ttbr": None, "headers": p.headers,
                                 "body": p.body}) for p in prepared]

        def send_raw(rows: list[object] = rows) -> None:
            for row in rows:
                raw_tx(send_sql.text, row, False)

        def send_raw_prepare(messages: list[OutgoingMessage] = messages) -> None:
            for message in messages:
                p = message.prepare()
                raw_tx(send_sql.text, send_sql.params({"id": to_driver(p.id), "ttbr": None,
                                                       "headers": p.headers, "body": p.body}),
                       False)

        def send_ours(messages: list[OutgoingMessage] = messages) -> None:
            for message in messages:
                transport.send("bench", message)

        def recv_raw() -> None:
            params = receive_sql.params({"n": 1})
            for _ in range(n):
                raw_tx(receive_sql.text, params, True)

        def recv_ours() -> None:
            for _ in range(n):
                transport.receive("bench")

        # Each send starts on an empty queue, each receive on n messages; raw and ours alternate.
        sends = [("send raw", send_raw), ("send ours", send_ours),
                 ("send raw+headers", send_raw_prepare)]
        receives = [("recv raw", recv_raw), ("recv ours", recv_ours)]
        shift = round_number % 3  # rotate the order: no side always runs first
        for label, function in sends[shift:] + sends[:shift]:
            transport.purge_all("bench")
            results[label].append(_rate(n, function))
        if round_number % 2:
            receives.reverse()
        for label, function in receives:
            transport.purge_all("bench")
            transport.send_many("bench", messages)
            results[label].append(_rate(n, function))
    raw.close()  # type: ignore[attr-defined]
    print(f"\n{name} (n={n}, rounds={rounds}, median msg/s)")
    for op, baseline in (("send", "send raw"), ("send", "send raw+headers"), ("recv", "recv raw")):
        ours = statistics.median(results[f"{op} ours"])
        base = statistics.median(results[baseline])
        print(f"  {op}: ours {ours:8.0f}  {baseline:>16} {base:8.0f}  ratio {ours / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "bench.db")
        transport = Transport(f"sqlite:///{path}")

        def sqlite_raw() -> sqlite3.Connection:
            connection = sqlite3.connect(path, isolation_level=None, timeout=30)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            return connection

        bench("SQLite (WAL, synchronous=NORMAL)", transport, sqlite_raw, args.n, args.rounds)
        transport.close()
    url = os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL")
    if not url:
        from tests import pg_cluster

        url = pg_cluster.start().url()
    transport = Transport(url)
    raw_url = url.replace("postgresql+psycopg://", "postgresql://")
    bench("PostgreSQL (psycopg 3, loopback TCP)", transport,
          lambda: psycopg.connect(raw_url), args.n, args.rounds)
    transport.close()


if __name__ == "__main__":
    main()
