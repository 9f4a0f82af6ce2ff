"""Live control's cost on the pump: an endpoint with and without its control poller.

Each round sends N messages, then runs an endpoint (concurrency 4, TRANSACTION_SCOPE, an empty
handler) until it has handled them, once with the control poller reading the endpoint's control
row every 0.5 s (as every endpoint does) and once without it (its thread not started); the order
alternates from round to round, so a machine busy with something else slows both alike. Printed:
the median messages/second of each, their ratio, and the median time of one poll (the
primary-key read and applying it) measured on its own.

Usage: ``python -m benchmarks.bench_control [--databases sqlite,postgresql] [--rounds 6]
[--messages 2000]``. PostgreSQL: a throwaway cluster, or ``$SQLQUEUE_BENCH_POSTGRES_URL``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator

from benchmarks import servers
from sqlqueue_orm import OutgoingMessage, Transport, control
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode
from sqlqueue_orm.receiving import control as receiving_control

QUEUE = "bench_control"


@contextlib.contextmanager
def without_poller() -> Iterator[None]:
    """Endpoints started in the block read their control row once, at start, and never again."""
    start = receiving_control.ControlPoller.start
    receiving_control.ControlPoller.start = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        receiving_control.ControlPoller.start = start  # type: ignore[method-assign]


def pump_rate(transport: Transport, messages: int) -> float:
    """Messages/second of one endpoint burning down *messages* (sent before it starts)."""
    transport.send_many(QUEUE, [OutgoingMessage(b"x") for _ in range(messages)])
    endpoint = Endpoint(
        QUEUE,
        transport,
        concurrency=4,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1,
    )

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        pass

    began = time.perf_counter()
    endpoint.start()
    try:
        while endpoint.stats.handled < messages:
            time.sleep(0.005)
        elapsed = time.perf_counter() - began
    finally:
        endpoint.stop(30)
    return messages / elapsed


def poll_time(transport: Transport, samples: int = 300) -> float:
    """Median seconds of one :meth:`ControlPoller.poll` (the row exists, nothing changes)."""
    endpoint = Endpoint(QUEUE, transport, concurrency=1)
    endpoint.handle_raw(lambda body, context: None)
    endpoint.start()
    try:
        poller = endpoint._control
        assert poller is not None
        times = []
        for _ in range(samples):
            began = time.perf_counter()
            poller.poll()
            times.append(time.perf_counter() - began)
    finally:
        endpoint.stop(30)
    return statistics.median(times)


def run(database: servers.Database, rounds: int, messages: int) -> None:
    """Alternating rounds on *database*; print the medians."""
    transport = Transport(database.url)
    try:
        transport.create_queue(QUEUE)
        control.set_concurrency(transport, QUEUE, None)  # a row to read, changing nothing
        pump_rate(transport, min(messages, 500))  # warm-up: caches, pool, first-use checks
        rates: dict[str, list[float]] = {"with poller": [], "without": []}
        for number in range(rounds):
            order = ("with poller", "without") if number % 2 == 0 else ("without", "with poller")
            for variant in order:
                if variant == "without":
                    with without_poller():
                        rates[variant].append(pump_rate(transport, messages))
                else:
                    rates[variant].append(pump_rate(transport, messages))
        poll = poll_time(transport)
    finally:
        transport.close()
    with_poller = statistics.median(rates["with poller"])
    without = statistics.median(rates["without"])
    print(f"{database.label}: {messages} messages x {rounds} rounds, alternating")
    for variant, values in rates.items():
        shown = ", ".join(f"{value:.0f}" for value in values)
        print(f"  {variant:12} median {statistics.median(values):8.0f} msg/s  ({shown})")
    print(f"  ratio with/without: {with_poller / without:.3f}")
    print(
        f"  one poll (primary-key read + apply): median {poll * 1e6:.0f} us, "
        f"every {receiving_control.POLL_INTERVAL} s"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run each database."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_control", description=__doc__)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.databases.split(",") if name.strip()]
    for name in names:
        if name == "sqlite":
            with servers.temporary_directory() as directory:
                run(servers.sqlite(directory), args.rounds, args.messages)
        elif name == "postgresql":
            run(servers.postgresql(), args.rounds, args.messages)
        else:
            parser.error(f"unknown database {name!r} (sqlite, postgresql)")


if __name__ == "__main__":
    main()
