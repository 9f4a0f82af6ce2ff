"""The peers, doing the same work on the same server: kombu's SQLAlchemy transport, PGQueuer.

Each is imported lazily (the ``bench`` extra installs them); :func:`unavailable` says why a peer
cannot run, and the run reports it as skipped with that reason instead of failing.

* kombu (``sqla+<url>``): ``SimpleQueue.put`` per message (it has no batch send); a receive is
  ``get_nowait()`` + ``ack()``, one message each (its ``_get`` takes one row ``FOR UPDATE``).
* PGQueuer: ``Queries.enqueue`` (one job, or lists for a batch); receiving is its own
  ``QueueManager.run(batch_size=..., mode=drain)`` loop, with asyncpg or with psycopg's async
  connection, and a handler that records the payload.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable
from typing import Any

from benchmarks import workload
from benchmarks.servers import Database


def unavailable(peer: str, database: Database) -> str | None:
    """Why *peer* cannot run on *database*, or None."""
    if peer.startswith("PGQueuer") and database.name != "postgresql":
        return "PGQueuer runs on PostgreSQL only"
    modules = {"kombu": ["kombu"], "PGQueuer (asyncpg)": ["pgqueuer", "asyncpg"],
               "PGQueuer (psycopg)": ["pgqueuer", "psycopg"]}
    for key, names in modules.items():
        if peer.startswith(key):
            for name in names:
                try:
                    importlib.import_module(name)
                except Exception as error:  # ImportError, or a broken install
                    return f"{name} not importable ({error}); pip install -e '.[bench]'"
    return None


# -- kombu ------------------------------------------------------------------------------------
def kombu_url(database: Database) -> str:
    return "sqla+" + database.url


def kombu_sender(database: Database, queue: str) -> tuple[Callable[[bytes], None],
                                                         Callable[[], None]]:
    """``send(body)`` through a kombu SimpleQueue, and its ``close``."""
    import kombu

    connection = kombu.Connection(kombu_url(database))
    simple = connection.SimpleQueue(queue)

    def send(body: bytes) -> None:
        simple.put(body, headers=workload.NSB_HEADERS)

    def close() -> None:
        simple.close()
        connection.release()

    return send, close


def kombu_receiver(database: Database, queue: str) -> tuple[Callable[[], list[bytes]],
                                                            Callable[[], None]]:
    """``receive()`` one message (get + ack) through a kombu SimpleQueue, and its ``close``."""
    import kombu

    connection = kombu.Connection(kombu_url(database))
    simple = connection.SimpleQueue(queue)
    empty = simple.Empty

    def receive() -> list[bytes]:
        try:
            message = simple.get_nowait()
        except empty:
            return []
        message.ack()
        return [bytes(message.body)]

    def close() -> None:
        simple.close()
        connection.release()

    return receive, close


# -- PGQueuer ---------------------------------------------------------------------------------
async def _pgqueuer_driver(side: str, database: Database) -> tuple[Any, Callable[[], Any]]:
    from pgqueuer.db import AsyncpgDriver, PsycopgDriver

    dsn = database.raw_dsn
    if "asyncpg" in side:
        import asyncpg

        connection = await asyncpg.connect(dsn)
        return AsyncpgDriver(connection), connection.close
    import psycopg

    async_connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return PsycopgDriver(async_connection), async_connection.close


def pgqueuer_install(database: Database) -> None:
    """Install PGQueuer's schema (tables, trigger, functions) once."""

    async def install() -> None:
        from pgqueuer.queries import Queries

        driver, close = await _pgqueuer_driver("asyncpg", database)
        queries = Queries(driver)
        if not await queries.schema_is_installed():
            await queries.install()
        await close()

    asyncio.run(install())


def pgqueuer_send(side: str, database: Database, entrypoint: str, start: int, count: int,
                  batch: int) -> workload.Timing:
    """Enqueue *count* jobs, *batch* per call (one transaction each); timed."""

    async def run() -> workload.Timing:
        from pgqueuer.queries import Queries

        driver, close = await _pgqueuer_driver(side, database)
        queries = Queries(driver)
        clock = time.perf_counter
        latencies = []
        started = clock()
        for offset in range(start, start + count, batch):
            size = min(batch, start + count - offset)
            before = clock()
            if size == 1:
                await queries.enqueue(entrypoint, workload.body(offset),
                                      headers=workload.NSB_HEADERS)
            else:
                await queries.enqueue([entrypoint] * size,
                                      [workload.body(offset + i) for i in range(size)],
                                      [0] * size, headers=[workload.NSB_HEADERS] * size)
            latencies.append(clock() - before)
        timing = workload.Timing(count, clock() - started, latencies)
        await close()
        return timing

    return asyncio.run(run())


def pgqueuer_drain(side: str, database: Database, entrypoint: str, per_transaction: int,
                   barrier: Any) -> tuple[float, float, int, list[float], list[int]]:
    """Run one QueueManager in drain mode after *barrier*; report like ``workers.consume``."""

    async def run() -> tuple[float, float, int, list[float], list[int]]:
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        driver, close = await _pgqueuer_driver(side, database)
        manager = QueueManager(Queries(driver))
        sequences: list[int] = []
        handled: list[float] = []
        clock = time.perf_counter

        @manager.entrypoint(entrypoint)
        async def handle(job: Any) -> None:
            sequences.append(workload.sequence_of(job.payload))
            handled.append(clock())

        barrier.wait(300)
        start = clock()
        await manager.run(batch_size=per_transaction, mode=QueueExecutionMode.drain)
        await close()
        # Steady state: from the first job handled to the last (its loop's start-up and
        # drain-mode shutdown are not receive work); the parent takes min/max over consumers.
        first = handled[0] if handled else start
        return first, handled[-1] if handled else start, len(sequences), [], sequences

    return asyncio.run(run())
