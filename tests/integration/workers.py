"""Functions run in child processes by the concurrency tests (importable under spawn)."""

from __future__ import annotations

import random

from sqlqueue_orm import Transport, db


def drain(url: str, queue: str, seed: int) -> list[str]:
    """Receive until the queue is empty, in transactions of 1-5 messages; return message ids."""
    rng = random.Random(seed)
    engine = db.create_engine(url)
    transport = Transport(engine)
    seen: list[str] = []
    empty_rounds = 0
    try:
        while empty_rounds < 3:
            with engine.begin() as connection:
                messages = transport.receive(queue, rng.randint(1, 5), connection=connection)
            if not messages:
                empty_rounds += 1
                continue
            empty_rounds = 0
            seen.extend(message.message_id for message in messages)
    finally:
        engine.dispose()
    return seen


def install(url: str, queue: str) -> bool:
    """Create the queue (several processes call this at once)."""
    engine = db.create_engine(url)
    try:
        return Transport(engine).create_queue(queue)
    finally:
        engine.dispose()


def send_stamped(url: str, queue: str, count: int, interval: float) -> None:
    """Send *count* messages *interval* s apart, each body the time.time() before its send."""
    import time

    from sqlqueue_orm import OutgoingMessage

    engine = db.create_engine(url)
    try:
        transport = Transport(engine)
        for _ in range(count):
            time.sleep(interval)
            transport.send(queue, OutgoingMessage(repr(time.time()).encode()))
    finally:
        engine.dispose()
