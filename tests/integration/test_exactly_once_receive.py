"""Exactly-once receive: competing consumers never get the same message twice, and none is lost."""

from __future__ import annotations

import multiprocessing

from sqlqueue_orm import (
    OutgoingMessage,
)
from tests.integration import workers


def test_four_processes_drain_10000_messages_each_exactly_once(database):
    transport = database.transport()
    transport.create_queue("work")
    with database.engine.begin() as connection:
        for start in range(0, 10_000, 2_000):
            transport.send_many(
                "work",
                [OutgoingMessage(b"w", message_id=f"m{i}") for i in range(start, start + 2_000)],
                connection=connection,
            )
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        results = pool.starmap(workers.drain, [(database.url, "work", seed) for seed in range(4)])
    everything = [message_id for result in results for message_id in result]
    assert len(everything) == 10_000
    assert set(everything) == {f"m{i}" for i in range(10_000)}
    assert sum(1 for result in results if result) >= 2  # the work really was shared
    for result in results:  # each receiver saw FIFO order
        assert result == sorted(result, key=lambda m: int(m[1:]))
