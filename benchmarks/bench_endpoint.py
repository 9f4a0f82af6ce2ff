"""Endpoint benchmark: the NOTIFY trigger's cost, the pump, and send-to-handler latency.

* trigger cost: THREADS threads each send N messages, one per transaction, to a PostgreSQL
  queue table with and without the wake-up trigger, in alternating rounds; messages/second.
* the pump end to end per mode (1 and 4 concurrency; SQLite: the two modes it runs) against a
  raw receive loop on as many threads with the same transaction structure (receive,
  SAVEPOINT, commit; OUTBOX: with its unit of work), empty handler;
* idle wake-up latency: an idle endpoint (peek delay 1 s); one message at a time is sent and
  the time from the send's commit to its handler's start measured (p50, p99), with polling
  only, NOTIFY (another writer), and in-process (the endpoint's own transport) on SQLite and
  PostgreSQL;
* sustained latency (PostgreSQL): another process sends 300 msg/s for 10 s, paced by a
  schedule; the endpoint (defaults, NOTIFY) handles them; p50, p95, p99 from each send's
  commit to its handler's start. The targets are printed beside each latency line.

Usage: ``python benchmarks/bench_endpoint.py [--n 1000] [--threads 4] [--rounds 3]
[--samples 40] [--rate 300] [--seconds 10] [--only pump|trigger|latency]``. Uses a throwaway
PostgreSQL cluster or $SQLQUEUE_BENCH_POSTGRES_URL. The pump cells and the latencies are also
scenarios of ``python -m benchmarks`` (``--only pump``: :func:`pump_scenario`,
:func:`wakeup_scenario`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlalchemy as sa

from benchmarks import workers, workload
from benchmarks.workload import Result
from sqlqueue_orm import OutgoingMessage, Transport, UnitOfWork, db
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode, wakeup
from sqlqueue_orm.sending.outbox import Outbox

if TYPE_CHECKING:
    from benchmarks.harness import Run


def postgres_url() -> str:
    url = os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL")
    if url:
        return url
    from testsupport import pg_cluster

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
    address = transport.queues.address("cost")
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


#: The latency targets (PostgreSQL), printed beside the figures.
IDLE_TARGET_P50_MS = 5.0
IDLE_TARGET_P99_MS = 20.0
SUSTAINED_TARGET_P95_MS = 25.0
#: The sustained line: messages per second from another process, for this many seconds.
SUSTAINED_RATE = 300
SUSTAINED_SECONDS = 10.0
WARM_UP = b"warm-up"


def idle_latencies(url: str, samples: int, *, notify: bool, own_transport: bool) -> list[float]:
    """Send-to-handler seconds of *samples* messages sent one at a time to an idle endpoint.

    Each is the handler's start minus the moment the send returned (its commit done); a
    warm-up send first, so the sender's first connection is not counted.
    """
    transport = Transport(url)
    handled = threading.Event()
    started: list[float] = []
    endpoint = Endpoint("idle", transport, peek_delay=1.0, notify=notify)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        started.append(time.perf_counter())
        handled.set()

    endpoint.start()
    sender = transport if own_transport else Transport(db.create_engine(url))
    times: list[float] = []
    try:
        for number in range(samples + 1):
            time.sleep(0.05 + (0.3 * (number % 3)) / 3)  # land anywhere in the peek delay
            handled.clear()
            started.clear()
            sender.send("idle", OutgoingMessage(b"ping"))
            committed = time.perf_counter()
            if not handled.wait(5):
                raise AssertionError("an idle endpoint took over 5 s to handle a message")
            if number:  # the first is the warm-up
                times.append(max(0.0, started[0] - committed))
    finally:
        endpoint.stop()
        if sender is not transport:
            sender.close()
        transport.close()
    return times


def percentiles(seconds: list[float], *points: float) -> list[float]:
    """The given percentiles (0..100, nearest rank) of *seconds*, in milliseconds."""
    ordered = sorted(seconds)
    return [
        ordered[min(len(ordered) - 1, int(len(ordered) * point / 100))] * 1000
        for point in points
    ]


def latency(label: str, url: str, samples: int, *, notify: bool, own_transport: bool) -> None:
    p50, p99 = percentiles(
        idle_latencies(url, samples, notify=notify, own_transport=own_transport), 50, 99
    )
    print(f"{label:<40} idle p50 {p50:7.1f} ms  p99 {p99:7.1f} ms   "
          f"(target p50 < {IDLE_TARGET_P50_MS:.0f}, p99 < {IDLE_TARGET_P99_MS:.0f})")


def paced_sender(url: str, queue: str, rate: float, seconds: float, ready: Any, go: Any,
                 results: Any) -> None:
    """In another process: send at *rate* msg/s for *seconds*, paced by a schedule.

    Message *n* is due at ``start + n / rate``; a send that is late goes at once (no sleep),
    so a stall is caught up rather than stretching the run. Puts ``{message id: the moment
    its send returned (time.time(), commit done)}`` and the seconds taken on *results*.
    """
    transport = Transport(db.create_engine(url))
    transport.send(queue, OutgoingMessage(WARM_UP))  # the connection, the first-use checks
    ready.set()
    go.wait()
    committed: dict[str, float] = {}
    count = int(rate * seconds)
    began = time.monotonic()
    for number in range(count):
        delay = began + number / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        message_id = transport.send(queue, OutgoingMessage(b"paced"))
        committed[message_id] = time.time()
    results.put((committed, time.monotonic() - began))
    transport.close()


def sustained_latencies(
    url: str, rate: float = SUSTAINED_RATE, seconds: float = SUSTAINED_SECONDS
) -> tuple[list[float], float]:
    """(send-to-handler seconds of each message, the rate the sender kept) at a steady *rate*.

    The sender is another process (:func:`paced_sender`), so the in-process wake-up does not
    help; the endpoint runs its defaults, with ``notify=True`` on PostgreSQL. Latency is the
    handler's start minus the moment the send's commit returned (one machine's clock).
    """
    transport = Transport(url)
    notify = transport.engine.dialect.name == "postgresql"
    starts: dict[str, float] = {}
    endpoint = Endpoint("sustained", transport, notify=notify)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        if body != WARM_UP:
            starts[context.message_id] = time.time()

    endpoint.start()
    spawn = multiprocessing.get_context("spawn")
    ready, go, results = spawn.Event(), spawn.Event(), spawn.Queue()
    process = spawn.Process(target=paced_sender,
                            args=(url, "sustained", rate, seconds, ready, go, results))
    process.start()
    try:
        if not ready.wait(60):
            raise AssertionError("the sending process did not start")
        time.sleep(0.5)  # the warm-up handled, the pump idle again
        go.set()
        committed, took = results.get(timeout=seconds * 3 + 60)
        deadline = time.monotonic() + 30
        while len(starts) < len(committed) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        process.join(30)
        endpoint.stop()
        transport.close()
    missing = set(committed) - set(starts)
    if missing:
        raise AssertionError(f"{len(missing)} of {len(committed)} paced messages not handled")
    return [max(0.0, starts[key] - committed[key]) for key in committed], len(committed) / took


def sustained(label: str, url: str, rate: float, seconds: float) -> None:
    latencies, kept = sustained_latencies(url, rate, seconds)
    p50, p95, p99 = percentiles(latencies, 50, 95, 99)
    print(f"{label:<40} {kept:,.0f} msg/s from another process for {seconds:.0f} s: "
          f"p50 {p50:.1f} ms  p95 {p95:.1f} ms  p99 {p99:.1f} ms   "
          f"(target p95 < {SUSTAINED_TARGET_P95_MS:.0f})")


#: The wake-ups measured per database: (label, notify, the endpoint's own transport sends).
WAKE_UPS = {
    "postgresql": [
        ("polling (peek delay 1 s)", False, False),
        ("NOTIFY (another writer)", True, False),
        ("in-process (same transport)", False, True),
    ],
    "sqlite": [
        ("polling (peek delay 1 s)", False, False),
        ("in-process (same transport)", False, True),
    ],
}


def modes_for(url: str) -> list[TransactionMode]:
    """Every mode the database can run with the endpoint's data in the same database."""
    if url.startswith("sqlite"):  # one writer: the others are refused (docs/endpoint.md)
        return [TransactionMode.NONE, TransactionMode.TRANSACTION_SCOPE]
    return list(TransactionMode)


def raw_loop(transport: Transport, queue: str, mode: TransactionMode, threads: int) -> int:
    """Receive until empty with the pump's transaction structure, no pump: messages taken.

    NONE: receive and commit. The others: receive and commit (the pump opens a handler's
    SAVEPOINT only when it first reaches the database; empty handlers have none); OUTBOX also
    opens and commits the unit of work with its outbox record in between, as the strategy does.
    """
    taken = [0] * threads
    outbox = Outbox(transport) if mode is TransactionMode.OUTBOX else None

    def work(index: int) -> None:
        while True:
            with transport.engine.connect() as connection:
                transaction = connection.begin()
                messages = transport.receive(queue, 1, connection=connection)
                if not messages:
                    transaction.rollback()
                    return
                if outbox is not None:  # its own connection: no SAVEPOINT on this one
                    with UnitOfWork(transport, mode="outbox", outbox=outbox,
                                    incoming_message_id=messages[0].message_id):
                        pass
                transaction.commit()
            taken[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(taken)


def pump_and_raw(
    transport: Transport, queue: str, mode: TransactionMode, threads: int, n: int
) -> tuple[float, float]:
    """(pump seconds, raw loop seconds) to drain *n* messages, empty handler, *threads* wide."""
    transport.purge_all(queue)
    transport.send_many(queue, [OutgoingMessage(b"x") for _ in range(n)])
    began = time.perf_counter()
    taken = raw_loop(transport, queue, mode, threads)
    raw = time.perf_counter() - began
    if taken != n:
        raise AssertionError(f"raw loop {mode.name}: took {taken} of {n}")
    transport.send_many(queue, [OutgoingMessage(b"x") for _ in range(n)])
    endpoint = Endpoint(queue, transport, transaction_mode=mode, concurrency=threads,
                        peek_delay=0.1, create_queues=False)
    endpoint.handle_raw(lambda body, context: None)
    return workload.drain_seconds(endpoint, n, f"pump {mode.name}"), raw


def prepare_pump(transport: Transport, queue: str) -> None:
    """The queues, the delayed table and the outbox table the pump cells use."""
    transport.create_queue(queue)
    transport.create_queue("error")
    transport.create_delayed_table(queue)  # the endpoint's mover polls it (create_queues=False)
    Outbox(transport).create_table()


def pump_vs_raw(label: str, url: str, n: int, rounds: int) -> None:
    transport = Transport(url)
    prepare_pump(transport, "pumped")
    for mode in modes_for(url):
        for threads in (1, 4):
            pumped: list[float] = []
            raw: list[float] = []
            for _ in range(rounds):
                ours, theirs = pump_and_raw(transport, "pumped", mode, threads, n)
                pumped.append(n / ours)
                raw.append(n / theirs)
            ours, theirs = statistics.median(pumped), statistics.median(raw)
            print(f"{label:<10} {mode.name:<25} x{threads}: pump {ours:6,.0f} msg/s, raw loop "
                  f"{theirs:6,.0f} msg/s ({ours / theirs:.2f}x)")
    transport.close()


# -- as scenarios of ``python -m benchmarks`` (``--only pump``) ---------------------------------
def pump_scenario(run: Run) -> None:
    """The pump end to end per mode, concurrency 1 and 4, beside the raw receive loop."""
    n = run.settings.messages
    queue = run.new_queue("pump")
    prepare_pump(run.transport, queue)
    for mode in modes_for(run.database.url):
        for threads in (1, 4):
            scenario = f"endpoint {mode.name}, concurrency {threads}"
            ours, theirs = pump_and_raw(run.transport, queue, mode, threads, n)
            run.add(Result.of(run.database.name, scenario, workers.PUMP,
                              workload.Timing(n, ours, []), note="empty handler"))
            run.add(Result.of(run.database.name, scenario, workers.RAW_LOOP,
                              workload.Timing(n, theirs, []),
                              note="the pump's transactions on as many threads, no pump"))


def wakeup_scenario(run: Run) -> None:
    """Send-to-handler latency: idle by each wake-up; on PostgreSQL also a sustained 300 msg/s.

    Idle: messages sent one at a time by polling, NOTIFY and in-process wake-up (p50, p99).
    Sustained: another process sends at :data:`SUSTAINED_RATE` msg/s for
    :data:`SUSTAINED_SECONDS` (p95 in the note). The targets are in the notes.
    """
    samples = max(5, min(30, run.settings.messages // 100))
    for side, notify, own in WAKE_UPS.get(run.database.name, []):
        seconds = idle_latencies(run.database.url, samples, notify=notify, own_transport=own)
        result = Result.of(run.database.name, "idle send-to-handler", f"{workers.OURS} {side}",
                           workload.Timing(len(seconds), sum(seconds), seconds),
                           note=f"{samples} messages sent one at a time, from the send's commit")
        if run.database.name == "postgresql" and side != WAKE_UPS["postgresql"][0][0]:
            p50, p99 = percentiles(seconds, 50, 99)
            result = result.aiming(
                f"target: p50 < {IDLE_TARGET_P50_MS:.0f} ms, p99 < {IDLE_TARGET_P99_MS:.0f} ms",
                f"{side}: p50 {p50:.1f} ms, p99 {p99:.1f} ms",
                p50 < IDLE_TARGET_P50_MS and p99 < IDLE_TARGET_P99_MS,
            )
        run.add(result)
    if run.database.name != "postgresql":  # the target is PostgreSQL's (NOTIFY)
        return
    seconds, kept = sustained_latencies(run.database.url)
    p50, p95, p99 = percentiles(seconds, 50, 95, 99)
    run.add(Result.of(run.database.name, f"send-to-handler at {SUSTAINED_RATE} msg/s",
                      f"{workers.OURS} NOTIFY (another process)",
                      workload.Timing(len(seconds), SUSTAINED_SECONDS, seconds),
                      note=f"sender kept {kept:,.0f} msg/s for {SUSTAINED_SECONDS:.0f} s")
            .aiming(f"target: p95 < {SUSTAINED_TARGET_P95_MS:.0f} ms",
                    f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms",
                    p95 < SUSTAINED_TARGET_P95_MS))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--rate", type=float, default=SUSTAINED_RATE)
    parser.add_argument("--seconds", type=float, default=SUSTAINED_SECONDS)
    parser.add_argument("--only", choices=["pump", "trigger", "latency"])
    args = parser.parse_args()
    admin = postgres_url()
    if args.only in (None, "pump"):
        pump_vs_raw("postgresql", fresh_database(admin), args.n, args.rounds)
        with tempfile.TemporaryDirectory() as directory:
            pump_vs_raw("sqlite", f"sqlite:///{directory}/pump.db", args.n, args.rounds)
    if args.only in (None, "trigger"):
        trigger_cost(fresh_database(admin), args.threads, args.n, args.rounds)
    if args.only not in (None, "latency"):
        return
    pg = fresh_database(admin)
    for side, notify, own in WAKE_UPS["postgresql"]:
        latency(f"postgresql {side}", pg, args.samples, notify=notify, own_transport=own)
    sustained("postgresql NOTIFY, sustained", pg, args.rate, args.seconds)
    with tempfile.TemporaryDirectory() as directory:
        lite = f"sqlite:///{directory}/bench.db"
        for side, notify, own in WAKE_UPS["sqlite"]:
            latency(f"sqlite {side}", lite, args.samples, notify=notify, own_transport=own)


if __name__ == "__main__":
    main()
