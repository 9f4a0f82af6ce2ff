"""The peers, doing the same work on the same server: kombu's SQLAlchemy transport, PGQueuer.

Each is imported lazily (the ``bench`` extra installs them); :func:`unavailable` says why a peer
cannot run, and the run reports it as skipped with that reason instead of failing.

* kombu (``sqla+<url>``): ``SimpleQueue.put`` per message (it has no batch send); a receive is
  ``get_nowait()`` + ``ack()``, one message each (its ``_get`` takes one row ``FOR UPDATE``).
* PGQueuer: ``Queries.enqueue`` (one job, or lists for a batch); receiving is its own
  ``QueueManager.run(batch_size=..., mode=drain)`` loop, with asyncpg or with psycopg's async
  connection, and a handler that records the payload. The coroutines (:func:`pgqueuer_driver`,
  :func:`pgqueuer_enqueue`, :func:`pgqueuer_drain_here`) also serve the asyncio cells, which
  run PGQueuer in their own event loop.
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
async def pgqueuer_driver(side: str, database: Database) -> tuple[Any, Callable[[], Any]]:
    """A PGQueuer driver on a connection of its own (asyncpg or psycopg async), and its close."""
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

        driver, close = await pgqueuer_driver("asyncpg", database)
        queries = Queries(driver)
        if not await queries.schema_is_installed():
            await queries.install()
        await close()

    asyncio.run(install())


async def pgqueuer_enqueue(queries: Any, entrypoint: str, start: int, count: int,
                           batch: int) -> workload.Timing:
    """Enqueue jobs *start* .. *start + count - 1* through *queries*, *batch* per call (one
    statement, its own transaction, each); timed."""
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
    return workload.Timing(count, clock() - started, latencies)


def pgqueuer_send(side: str, database: Database, entrypoint: str, start: int, count: int,
                  batch: int) -> workload.Timing:
    """Enqueue *count* jobs, *batch* per call (one transaction each); timed."""

    async def run() -> workload.Timing:
        from pgqueuer.queries import Queries

        driver, close = await pgqueuer_driver(side, database)
        timing = await pgqueuer_enqueue(Queries(driver), entrypoint, start, count, batch)
        await close()
        return timing

    return asyncio.run(run())


def _drain_manager(driver: Any, entrypoint: str) -> tuple[Any, list[int], list[float]]:
    """A QueueManager on *driver* whose handler of *entrypoint* records each job's sequence
    number and when it ran: the manager, the numbers, the times."""
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    manager = QueueManager(Queries(driver))
    sequences: list[int] = []
    handled: list[float] = []
    clock = time.perf_counter

    @manager.entrypoint(entrypoint)
    async def handle(job: Any) -> None:
        sequences.append(workload.sequence_of(job.payload))
        handled.append(clock())

    return manager, sequences, handled


async def pgqueuer_drain_here(driver: Any, entrypoint: str, batch: int
                              ) -> tuple[float, float, float, list[int]]:
    """Run one QueueManager in drain mode in this event loop, *batch* jobs per dequeue.

    Returns when it was started, when its first job was handled, when it returned (every job's
    completion logged: its acknowledgement) and the sequence numbers handled.
    """
    from pgqueuer.types import QueueExecutionMode

    manager, sequences, handled = _drain_manager(driver, entrypoint)
    started = time.perf_counter()
    await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
    returned = time.perf_counter()
    return started, handled[0] if handled else started, returned, sequences


def pgqueuer_drain(side: str, database: Database, entrypoint: str, per_transaction: int,
                   barrier: Any) -> tuple[float, float, int, list[float], list[int]]:
    """Run one QueueManager in drain mode after *barrier*; report like ``workers.consume``."""

    async def run() -> tuple[float, float, int, list[float], list[int]]:
        from pgqueuer.types import QueueExecutionMode

        driver, close = await pgqueuer_driver(side, database)
        manager, sequences, handled = _drain_manager(driver, entrypoint)
        clock = time.perf_counter
        barrier.wait(300)
        start = clock()
        await manager.run(batch_size=per_transaction, mode=QueueExecutionMode.drain)
        await close()
        # Steady state: from the first job handled to the last (its loop's start-up and
        # drain-mode shutdown are not receive work); the parent takes min/max over consumers.
        first = handled[0] if handled else start
        return first, handled[-1] if handled else start, len(sequences), [], sequences

    return asyncio.run(run())
