"""CPU time per message of our layer: ``time.process_time()`` around ours and the raw loop.

Wall-clock ratios are noisy on a shared machine; the CPU time this process spends per message
is not (much). For each path it runs ours and the raw driver (the very statements
``TableQueue`` renders; the raw send builds its headers with the ``json`` module, the raw receive
parses each row's headers with ``json.loads``: ``baselines.RawQueue``) on the same queue, and
prints µs of process time per message for both (the least of the rounds: noise only ever adds)
and their difference: what our layer costs.
SQLite runs in-process, so its figures include SQLite's own work (the same on both sides).

``python -m benchmarks.cpu_cost [--messages 3000] [--rounds 3] [--databases sqlite,postgresql]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from benchmarks import baselines, servers, workload
from sqlqueue_orm import OutgoingMessage, Transport

#: Messages per ``send_many`` (and per raw ``executemany``) in the batch cells.
_BATCH = 500


def _cpu(operation: Callable[[], object], count: int) -> float:
    """µs of process time per call of *operation*, *count* calls."""
    started = time.process_time()
    for _ in range(count):
        operation()
    return (time.process_time() - started) / count * 1e6


def measure(database: servers.Database, messages: int, rounds: int) -> dict[str, list[float]]:
    """Per path: lists of µs per message, ours and raw, one entry per round."""
    found: dict[str, list[float]] = {}
    with Transport(database.url) as transport:
        for _ in range(rounds):
            for name, value in _round(transport, database, messages).items():
                found.setdefault(name, []).append(value)
    return found


def _round(transport: Transport, database: servers.Database, messages: int) -> dict[str, float]:
    """One round of every path, ours and raw one after the other, on a new queue."""
    queue = f"cpu_{time.monotonic_ns() % 10**9}"
    transport.create_queue(queue)
    workload.warm_up(transport, queue)  # connect and look the queue up, untimed
    raw_auto = baselines.RawQueue(database, queue, autocommit=True)
    raw_tx = baselines.RawQueue(database, queue, autocommit=False)
    engine = transport.engine
    found: dict[str, float] = {}

    def sends(name: str, send: Callable[[OutgoingMessage], object]) -> None:
        items = iter(workload.outgoing(0, messages))
        found[name] = _cpu(lambda: send(next(items)), messages)

    def raw_sends(name: str, raw: baselines.RawQueue) -> None:
        items = iter(workload.outgoing(0, messages))
        found[name] = _cpu(lambda: raw.send_messages([next(items)]), messages)

    def batches(name: str, send: Callable[[list[OutgoingMessage]], object]) -> None:
        items = workload.outgoing(0, messages - messages % _BATCH or _BATCH)
        chunks = iter([items[i:i + _BATCH] for i in range(0, len(items), _BATCH)])
        found[name] = _cpu(lambda: send(next(chunks)), len(items) // _BATCH) / _BATCH

    def receives(name: str, receive: Callable[[], object]) -> None:
        transport.send_many(queue, workload.outgoing(0, messages))  # untimed fill
        found[name] = _cpu(receive, messages)

    def send_in_tx(message: OutgoingMessage) -> None:
        with engine.begin() as connection:
            transport.send(queue, message, connection=connection)

    def receive_in_tx() -> None:
        with engine.begin() as connection:
            transport.receive(queue, connection=connection)

    def receive_in_begin() -> None:  # the same guarantee on the thread's kept connection
        with transport.begin() as connection:
            transport.receive(queue, connection=connection)

    sends("send ours", lambda message: transport.send(queue, message))
    raw_sends("send raw autocommit", raw_auto)
    sends("send in tx ours", send_in_tx)
    raw_sends("send raw BEGIN/COMMIT", raw_tx)
    batches("send 500 ours", lambda chunk: transport.send_many(queue, chunk))
    batches("send 500 raw", raw_tx.send_messages)
    transport.purge_all(queue)
    receives("recv ours", lambda: transport.receive(queue))
    receives("recv raw autocommit", lambda: raw_auto.receive(1))
    receives("recv in tx ours", receive_in_tx)
    receives("recv raw BEGIN/COMMIT", lambda: raw_tx.receive(1))
    receives("recv in begin ours", receive_in_begin)
    message = workload.outgoing(0, 1)[0]
    found["prepare only"] = _cpu(message.prepare, messages)
    raw_auto.close()
    raw_tx.close()
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_cost")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    pairs = (("send ours", "send raw autocommit"), ("recv ours", "recv raw autocommit"),
             ("recv in tx ours", "recv raw BEGIN/COMMIT"),
             ("recv in begin ours", "recv raw BEGIN/COMMIT"),
             ("send in tx ours", "send raw BEGIN/COMMIT"), ("send 500 ours", "send 500 raw"))
    with servers.temporary_directory() as directory:
        for name in args.databases.split(","):
            database = servers.sqlite(directory) if name == "sqlite" else servers.postgresql()
            found = measure(database, args.messages, args.rounds)
            print(f"\n{database.label}: µs of process time per message (least of "
                  f"{args.rounds} rounds of {args.messages})")
            for ours, raw in pairs:
                mine, base = min(found[ours]), min(found[raw])
                print(f"  {ours:18} {mine:7.1f}   {raw:22} {base:7.1f}   ours - raw "
                      f"{mine - base:6.1f}")
            print(f"  {'prepare only':18} {min(found['prepare only']):7.1f}")


if __name__ == "__main__":
    main()
