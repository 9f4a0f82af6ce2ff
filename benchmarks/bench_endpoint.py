"""Endpoint benchmark: the NOTIFY trigger's cost on concurrent sends, and idle wake-up latency.

* trigger cost: THREADS threads each send N messages, one per transaction, to a PostgreSQL
  queue table with and without the wake-up trigger, in alternating rounds; messages/second.
* the pump end to end per mode (1 and 4 concurrency) against a raw receive loop on as many
  threads with the same transaction structure (receive, SAVEPOINT, commit), empty handler;
* idle wake-up latency: an idle endpoint (peek delay 1 s); one message at a time is sent and
  the time to its handler measured (p50, p99), with polling only, NOTIFY (another writer), and
  in-process (the endpoint's own transport) on SQLite and PostgreSQL.

Usage: ``python benchmarks/bench_endpoint.py [--n 1000] [--threads 4] [--rounds 3]
[--samples 40]``. Uses a throwaway PostgreSQL cluster or $SQLQUEUE_BENCH_POSTGRES_URL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, Transport, db
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode, wakeup


def postgres_url() -> str:
    url = os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL")
    if url:
        return url
    from tests import pg_cluster

    return pg_cluster.start().url()


def fresh_database(admin_url: str) -> str:
    name = f"b_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def concurrent_sends(transport: Transport, queue: str, threads: int, n: int) -> float:
    def work() -> None:
        for _ in range(n):
            transport.send(queue, OutgoingMessage(b"x"))

    workers = [threading.Thread(target=work) for _ in range(threads)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * n / (time.perf_counter() - began)


def trigger_cost(url: str, threads: int, n: int, rounds: int) -> None:
    transport = Transport(url)
    address = transport.address("cost")
    transport.create_queue("cost")
    rates: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for kind in ("without", "with"):
            if kind == "with":
                wakeup.install_trigger(transport.engine, address)
            else:
                wakeup.remove_trigger(transport.engine, address)
            transport.purge_all("cost")
            rates[kind].append(concurrent_sends(transport, "cost", threads, n))
    without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
    print(
        f"postgresql  {threads} threads x {n} sends: without trigger {without:,.0f} msg/s, "
        f"with {with_:,.0f} msg/s ({with_ / without:.2f}x)"
    )
    transport.close()


def latency(label: str, url: str, samples: int, *, notify: bool, own_transport: bool) -> None:
    transport = Transport(url)
    handled = threading.Event()
    endpoint = Endpoint("idle", transport, peek_delay=1.0, notify=notify)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        handled.set()

    endpoint.start()
    sender = transport if own_transport else Transport(db.create_engine(url))
    times: list[float] = []
    for _ in range(samples):
        time.sleep(0.05 + (0.3 * (len(times) % 3)) / 3)  # land anywhere in the peek delay
        handled.clear()
        began = time.perf_counter()
        sender.send("idle", OutgoingMessage(b"ping"))
        handled.wait(5)
        times.append((time.perf_counter() - began) * 1000)
    endpoint.stop()
    times.sort()
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"{label:<34} idle wake-up p50 {p50:7.1f} ms  p99 {p99:7.1f} ms")
    if sender is not transport:
        sender.close()
    transport.close()


def raw_loop(transport: Transport, queue: str, mode: TransactionMode, threads: int) -> int:
    """Receive until empty with the pump's transaction structure, no pump: messages taken."""
    taken = [0] * threads

    def work(index: int) -> None:
        while True:
            with transport.engine.connect() as connection:
                transaction = connection.begin()
                messages = transport.receive(queue, 1, connection=connection)
                if not messages:
                    transaction.rollback()
                    return
                if mode is TransactionMode.NONE:
                    transaction.commit()
                else:
                    savepoint = connection.begin_nested()  # around the handlers, as the pump
                    savepoint.commit()
                    transaction.commit()
            taken[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(taken)


def pump_vs_raw(label: str, url: str, n: int, rounds: int) -> None:
    transport = Transport(url)
    transport.create_queue("pumped")
    transport.create_queue("error")
    modes = [TransactionMode.NONE, TransactionMode.TRANSACTION_SCOPE]
    if not url.startswith("sqlite"):
        modes.insert(1, TransactionMode.RECEIVE_ONLY)
    for mode in modes:
        for threads in (1, 4):
            pumped: list[float] = []
            raw: list[float] = []
            for _ in range(rounds):
                transport.purge_all("pumped")
                transport.send_many("pumped", [OutgoingMessage(b"x") for _ in range(n)])
                began = time.perf_counter()
                assert raw_loop(transport, "pumped", mode, threads) == n
                raw.append(n / (time.perf_counter() - began))
                transport.send_many("pumped", [OutgoingMessage(b"x") for _ in range(n)])
                endpoint = Endpoint("pumped", transport, transaction_mode=mode,
                                    concurrency=threads, peek_delay=0.1, create_queues=False)
                endpoint.handle_raw(lambda body, context: None)
                began = time.perf_counter()
                endpoint.start()
                while endpoint.stats.handled < n:
                    time.sleep(0.001)
                pumped.append(n / (time.perf_counter() - began))
                endpoint.stop()
            ours, theirs = statistics.median(pumped), statistics.median(raw)
            print(f"{label:<10} {mode.name:<18} x{threads}: pump {ours:6,.0f} msg/s, raw loop "
                  f"{theirs:6,.0f} msg/s ({ours / theirs:.2f}x)")
    transport.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--only", choices=["pump", "trigger", "latency"])
    args = parser.parse_args()
    admin = postgres_url()
    if args.only in (None, "pump"):
        pump_vs_raw("postgresql", fresh_database(admin), args.n, args.rounds)
        with tempfile.TemporaryDirectory() as directory:
            pump_vs_raw("sqlite", f"sqlite:///{directory}/pump.db", args.n, args.rounds)
    if args.only == "pump":
        return
    trigger_cost(fresh_database(admin), args.threads, args.n, args.rounds)
    pg = fresh_database(admin)
    latency("postgresql polling (1 s)", pg, args.samples, notify=False, own_transport=False)
    latency("postgresql NOTIFY (another writer)", pg, args.samples, notify=True,
            own_transport=False)
    latency("postgresql in-process", pg, args.samples, notify=False, own_transport=True)
    with tempfile.TemporaryDirectory() as directory:
        lite = f"sqlite:///{directory}/bench.db"
        latency("sqlite polling (1 s)", lite, args.samples, notify=False, own_transport=False)
        latency("sqlite in-process", lite, args.samples, notify=False, own_transport=True)


if __name__ == "__main__":
    main()
