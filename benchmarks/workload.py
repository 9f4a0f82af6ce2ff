"""What every scenario shares: 1 KB messages with NServiceBus headers, timing, the checks."""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqlqueue_orm import OutgoingMessage, Transport, headers

BODY_SIZE = 1024
_SEQUENCE_DIGITS = 10

#: Headers an NServiceBus endpoint puts on a sent command, less the ones ``prepare()`` adds
#: (MessageId, TimeSent); the values are of the usual length.
NSB_HEADERS = {
    headers.CONTENT_TYPE: "application/json",
    headers.ENCLOSED_MESSAGE_TYPES: (
        "Shop.Messages.Commands.PlaceOrder, Shop.Messages, Version=1.0.0.0, Culture=neutral, "
        "PublicKeyToken=null"
    ),
    headers.MESSAGE_INTENT: "Send",
    headers.ORIGINATING_ENDPOINT: "Shop.Sales",
    headers.ORIGINATING_MACHINE: "web-01",
    headers.REPLY_TO_ADDRESS: "Shop.Sales@[dbo]@[shop]",
    "NServiceBus.Version": "9.2.3",
    "$.diagnostics.originating.hostid": "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
    "NServiceBus.TimeToBeReceived": "10675199.02:48:05.4775807",
}


def body(sequence: int) -> bytes:
    """A 1 KB body that starts with its sequence number (for the exactly-once check)."""
    return (b"%0*d" % (_SEQUENCE_DIGITS, sequence)).ljust(BODY_SIZE, b"x")


def sequence_of(data: bytes | bytearray | memoryview | None) -> int:
    """The sequence number :func:`body` wrote."""
    if data is None:
        raise AssertionError("a message arrived without its body")
    return int(bytes(data[:_SEQUENCE_DIGITS]))


def outgoing(start: int, count: int) -> list[OutgoingMessage]:
    """Messages *start* .. *start + count - 1*, each with the NServiceBus headers."""
    return [
        OutgoingMessage(body(number), headers=NSB_HEADERS, message_id=str(uuid.uuid4()))
        for number in range(start, start + count)
    ]


def check_exactly_once(received: Iterable[int], expected: range, what: str) -> None:
    """Raise unless every number of *expected* arrived once and nothing else arrived."""
    seen = list(received)
    unique = set(seen)
    if len(seen) != len(unique):
        raise AssertionError(f"{what}: {len(seen) - len(unique)} message(s) arrived twice")
    wanted = set(expected)
    if unique != wanted:
        missing, extra = len(wanted - unique), len(unique - wanted)
        raise AssertionError(f"{what}: {missing} message(s) lost, {extra} unexpected")


@dataclasses.dataclass
class Timing:
    """Wall time of a run and the latency of each operation (one transaction) in it."""

    messages: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def timed(operations: int, messages_per_operation: int, operation: Callable[[], object]) -> Timing:
    """Run *operation* *operations* times; time the whole and each call."""
    clock = time.perf_counter
    latencies = []
    started = clock()
    for _ in range(operations):
        before = clock()
        operation()
        latencies.append(clock() - before)
    return Timing(operations * messages_per_operation, clock() - started, latencies)


def timed_for(operations: int, budget: float, operation: Callable[[], object]) -> Timing:
    """As :func:`timed` with one message each, stopping early after *budget* seconds (>= 3 calls).

    For operations whose cost may grow with the data (a peek that scans the table).
    """
    clock = time.perf_counter
    latencies = []
    started = clock()
    for number in range(operations):
        before = clock()
        operation()
        latencies.append(clock() - before)
        if number >= 2 and clock() - started > budget:
            break
    return Timing(len(latencies), clock() - started, latencies)


def merge(timings: list[tuple[float, float, int, list[float]]]) -> Timing:
    """Combine consumers' (start, end, messages, latencies): wall time first start to last end.

    ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, the same clock in every process.
    """
    start = min(item[0] for item in timings)
    end = max(item[1] for item in timings)
    latencies = [value for item in timings for value in item[3]]
    return Timing(sum(item[2] for item in timings), end - start, latencies)


def warm_up(transport: Transport, queue: str) -> None:
    """Connect and look *queue* up before a clock starts, as the raw loops probe before theirs.

    The first use of a queue looks its table up in the catalog (columns and indexes: the
    schema warnings and the hot path's probe), once per queue and transport; a peek alone
    leaves that to the first send or receive, inside the clock.
    """
    transport.peek(queue)
    transport.queues.ready(transport.queues.table_queue(queue))


def median_round(rounds: list[Timing]) -> Timing:
    """The round of median rate (the lower middle of an even count), with every round's
    latencies: one side's figure from rounds alternated with the other sides'."""
    ordered = sorted(rounds, key=lambda timing: timing.rate)
    middle = ordered[(len(ordered) - 1) // 2]
    latencies = [value for timing in rounds for value in timing.latencies]
    return Timing(middle.messages, middle.seconds, latencies)


@dataclasses.dataclass
class Result:
    """One measured (or skipped) cell: a scenario on a database by one side."""

    database: str
    scenario: str
    side: str
    messages: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    skipped: str | None = None
    #: The target this cell aims at (such as ">= 15,000 msg/s"), what the run measured against
    #: it (such as "16,200 msg/s, 0.93x raw") and whether it was met: printed in the targets
    #: block.
    target: str = ""
    measured: str = ""
    met: bool | None = None
    #: The 95th percentile (nearest rank) of the operations' latencies.
    p95_ms: float | None = None

    @classmethod
    def of(cls, database: str, scenario: str, side: str, timing: Timing,
           note: str = "") -> Result:
        latencies = sorted(timing.latencies)
        p50 = p95 = p99 = None
        if latencies:
            p50 = statistics.median(latencies) * 1000
            p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))] * 1000
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        return cls(database, scenario, side, timing.messages, timing.seconds, timing.rate, p50,
                   p99, note, p95_ms=p95)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def aiming(self, target: str, measured: str, met: bool) -> Result:
        """This result with a *target* beside what was *measured*, and whether *met*."""
        return dataclasses.replace(self, target=target, measured=measured, met=met)


def drain_seconds(endpoint: Any, n: int, what: str) -> float:
    """Start *endpoint* and wait until it has handled *n* messages; the seconds from the start.

    Fails naming *what* when a handler failed or ten minutes passed; the endpoint is stopped.
    """
    began = time.perf_counter()
    endpoint.start()
    try:
        deadline = began + 600
        while endpoint.stats.handled < n:
            if time.perf_counter() > deadline or endpoint.stats.failed:
                raise AssertionError(f"{what}: {endpoint.stats}")
            time.sleep(0.001)
        return time.perf_counter() - began
    finally:
        endpoint.stop()
