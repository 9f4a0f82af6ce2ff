"""What endpoint heartbeats cost the pump: the same drain with heartbeats on and off.

Each round drains N messages through an endpoint (TRANSACTION_SCOPE, empty handler, concurrency
4) four times, in an order that alternates between rounds: both operations threads off (no
heartbeat, no control poll); heartbeats every second (``heartbeat_interval=1``, five times the
default, to be conservative); heartbeats and queue samples every second (``metrics_interval=1``,
sixty times the default); and both threads on, heartbeats every second and the control poller
reading its row every 0.5 s (samples at their default). The control table exists in every
round; "off" does not start the poller. The median rate of each and its ratio to "off" are
printed. The target: heartbeats cost under 1% of the
pump's rate. On a machine shared with other work the ratio swings by more than that; take the
figure from a quiet machine.

It also times one beat of the health writer alone, one with its queue samples, and one control
poll (milliseconds, median of 50): the database work each adds, steadier than the rates.

Usage: ``python benchmarks/bench_heartbeat.py [--n 5000] [--rounds 5] [--url URL]`` (default:
a SQLite file and a throwaway PostgreSQL cluster, or $SQLQUEUE_BENCH_POSTGRES_URL). Also the
scenario ``heartbeat`` of ``python -m benchmarks`` (:func:`heartbeat_scenario`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import workers, workload
from benchmarks.bench_control import without_poller
from benchmarks.workload import Result
from sqlqueue_orm import OutgoingMessage, Transport, control
from sqlqueue_orm.receiving import Endpoint, TransactionMode, health

if TYPE_CHECKING:
    from benchmarks.harness import Run

#: The target: the pump's rate with heartbeats at least this share of its rate without.
TARGET_RATIO = 0.99
#: Seconds between beats (and samples) in the "on" rounds.
BEAT = 1.0
CONCURRENCY = 4
#: Alternating rounds of the ``heartbeat`` scenario of ``python -m benchmarks``.
ROUNDS = 5


#: The rounds' variants: name, heartbeat_interval, metrics_interval, control poller on.
VARIANTS = (
    ("off", None, 60.0, False),
    (f"every {BEAT:g} s", BEAT, 60.0, False),
    (f"and samples every {BEAT:g} s", BEAT, BEAT, False),
    (f"every {BEAT:g} s + control polls", BEAT, 60.0, True),
)


def drain(
    transport: Transport,
    queue: str,
    n: int,
    heartbeat: float | None,
    metrics: float,
    poller: bool = False,
) -> float:
    """Messages per second the pump drains *n* messages at, with these intervals.

    :param poller: whether the endpoint's control poller runs (else it reads once, at start).
    """
    if not poller:
        with without_poller():
            return drain(transport, queue, n, heartbeat, metrics, poller=True)
    transport.purge_all(queue)
    transport.send_many(queue, [OutgoingMessage(b"x") for _ in range(n)])
    endpoint = Endpoint(
        queue,
        transport,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        concurrency=CONCURRENCY,
        peek_delay=0.1,
        create_queues=False,
        delayed_delivery=False,
        heartbeat_interval=heartbeat,
        metrics_interval=metrics,
    )
    endpoint.handle_raw(lambda body, context: None)
    return n / workload.drain_seconds(endpoint, n, "heartbeat bench")


def compare(transport: Transport, queue: str, n: int, rounds: int) -> dict[str, float]:
    """The median rate of each variant, from rounds that alternate their order."""
    control.create_tables(transport.engine, log_too=False)  # the poller reads a real row
    rates: dict[str, list[float]] = {name: [] for name, *_rest in VARIANTS}
    for index in range(rounds):
        order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
        for name, heartbeat, metrics, poller in order:
            rates[name].append(drain(transport, queue, n, heartbeat, metrics, poller))
    return {name: statistics.median(found) for name, found in rates.items()}


def beat_cost(transport: Transport, queue: str, beats: int = 50) -> tuple[float, float, float]:
    """Median milliseconds of one heartbeat alone, one with its queue samples, one control poll.

    Timed on the health writer of a running endpoint with an idle queue: the database work one
    beat adds, whatever else the machine runs (a steadier figure than the pump's rates).
    """
    endpoint = Endpoint(
        queue,
        transport,
        create_queues=False,
        delayed_delivery=False,
        heartbeat_interval=None,
        peek_delay=1.0,
    )
    endpoint.handle_raw(lambda body, context: None)
    endpoint.start()
    try:
        settings = endpoint.settings.replace(heartbeat_interval=BEAT, metrics_interval=BEAT)
        writer = health.HealthWriter(endpoint.name, transport, endpoint._pumps(), settings)
        writer._write(final=False)  # the tables and the row exist from here on
        alone: list[float] = []
        sampled: list[float] = []
        polls: list[float] = []
        poller = endpoint._control
        assert poller is not None
        for _ in range(beats):
            began = time.perf_counter()
            writer._write(final=False)  # a heartbeat (the last sample is recent)
            alone.append(time.perf_counter() - began)
            writer._last_sample = float("-inf")
            began = time.perf_counter()
            writer._write(final=False)  # a heartbeat and the samples
            sampled.append(time.perf_counter() - began)
            began = time.perf_counter()
            poller.poll()
            polls.append(time.perf_counter() - began)
        writer._write(final=True)
    finally:
        endpoint.stop()
    medians = [1000 * statistics.median(found) for found in (alone, sampled, polls)]
    return medians[0], medians[1], medians[2]


def heartbeat_scenario(run: Run) -> None:
    """The pump with heartbeats (and samples, and control polls) beside the pump without them."""
    n = run.settings.messages
    queue = run.new_queue("heartbeat")
    run.transport.create_queue("error")
    rates = compare(run.transport, queue, n, rounds=ROUNDS)
    off = rates["off"]
    scenario = f"endpoint heartbeats, concurrency {CONCURRENCY}"
    for name, rate in rates.items():
        result = Result.of(
            run.database.name,
            scenario,
            f"{workers.PUMP}, heartbeats {name}",
            workload.Timing(n, n / rate, []),
            note=f"median of {ROUNDS} alternating rounds",
        )
        if name != "off":
            result = result.aiming(
                f"target: >= {TARGET_RATIO:.2f}x without",
                f"{rate / off:.3f}x without",
                rate / off >= TARGET_RATIO,
            )
        run.add(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--url",
        action="append",
        default=None,
        help="a database to measure (repeatable; default SQLite and PostgreSQL)",
    )
    args = parser.parse_args()
    urls = args.url
    if urls is None:
        from benchmarks.bench_endpoint import fresh_database, postgres_url

        folder = tempfile.mkdtemp(prefix="bench-heartbeat-")
        urls = [f"sqlite:///{folder}/bench.db", fresh_database(postgres_url())]
    for url in urls:
        transport = Transport(url)
        transport.create_queue("heartbeat_bench")
        transport.create_queue("error")
        rates = compare(transport, "heartbeat_bench", args.n, args.rounds)
        name = transport.engine.dialect.name
        alone, sampled, poll = beat_cost(transport, "heartbeat_bench")
        print(
            f"{name:<10} one beat {alone:.2f} ms, one beat with its queue samples "
            f"{sampled:.2f} ms, one control poll {poll:.2f} ms (median of 50; defaults: a "
            f"beat every 5 s, samples every 60 s, a poll every 0.5 s)",
            flush=True,
        )
        off = rates["off"]
        for variant, rate in rates.items():
            print(
                f"{name:<10} pump x{CONCURRENCY}, {args.n} msgs, median of {args.rounds}: "
                f"heartbeats {variant:<30} {rate:7,.0f} msg/s ({rate / off:.3f}x; cost "
                f"{100 * (1 - rate / off):+.1f}%)",
                flush=True,
            )
        transport.close()


if __name__ == "__main__":
    main()
