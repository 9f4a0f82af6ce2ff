"""Consumer processes: each side drains one queue, reporting what it got and when.

Each function here makes its own connections in the child process, waits on the barrier with
the others, then drains
until the queue is empty and puts ``(start, end, messages, latencies, sequences)`` on *out*.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import workload
from benchmarks.servers import Database

OURS = "sqlqueue_orm"
OURS_TX = "sqlqueue_orm in caller's tx"
#: The caller's transaction by ``Transport.begin()`` (a kept connection) instead of
#: ``engine.begin()`` (a pool checkout and a new Connection per transaction).
OURS_KEPT = "sqlqueue_orm in transport.begin()"
KOMBU = "kombu (SQLAlchemy)"
PGQUEUER_ASYNCPG = "PGQueuer (asyncpg)"
PGQUEUER_PSYCOPG = "PGQueuer (psycopg)"
#: The endpoint's cells (bench_endpoint.py): our pump, and the loop it is measured against.
PUMP = "sqlqueue_orm Endpoint pump"
RAW_LOOP = "raw receive loop (same transactions)"


def consume(side: str, database: Database, queue: str, per_transaction: int, barrier: Any,
            out: Any) -> None:
    """Drain *queue* as *side*, *per_transaction* messages per receive."""
    try:
        receive, close = _receiver(side, database, queue, per_transaction)
        clock = time.perf_counter
        latencies: list[float] = []
        sequences: list[int] = []
        barrier.wait(300)
        start = clock()
        while True:
            before = clock()
            bodies = receive()
            if not bodies:
                break
            latencies.append(clock() - before)
            sequences.extend(workload.sequence_of(body) for body in bodies)
        end = clock()
        close()
        out.put((start, end, len(sequences), latencies, sequences))
    except BaseException as error:  # reported to the parent, which fails the cell
        out.put(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        raise


def _receiver(side: str, database: Database, queue: str, per_transaction: int) -> Any:
    if side in (OURS, OURS_TX, OURS_KEPT):
        from sqlqueue_orm import Transport

        transport = Transport(database.url)
        workload.warm_up(transport, queue)  # connect and look the queue up, untimed

        if side == OURS:
            def receive() -> list[Any]:
                return [m.body for m in transport.receive(queue, per_transaction)]
        else:
            begin = transport.engine.begin if side == OURS_TX else transport.begin

            def receive() -> list[Any]:
                with begin() as connection:
                    messages = transport.receive(queue, per_transaction, connection=connection)
                return [m.body for m in messages]

        return receive, transport.close
    if side == KOMBU:
        from benchmarks import peers

        return peers.kombu_receiver(database, queue)
    from benchmarks import baselines

    raw = baselines.RawQueue(database, queue, autocommit=side == baselines.AUTOCOMMIT)
    raw.peek()

    def receive_raw() -> list[Any]:
        return raw.receive(per_transaction)

    return receive_raw, raw.close


def consume_pgqueuer(side: str, database: Database, entrypoint: str, per_transaction: int,
                     barrier: Any, out: Any) -> None:
    """Drain PGQueuer's queue with its own QueueManager loop (drain mode)."""
    try:
        from benchmarks import peers

        out.put(peers.pgqueuer_drain(side, database, entrypoint, per_transaction, barrier))
    except BaseException as error:
        out.put(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        raise
