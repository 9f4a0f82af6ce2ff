"""asyncio (``--only asyncio``): sqlqueue_orm.aio beside the raw async driver, on PostgreSQL.

For each async driver (asyncpg; psycopg's ``AsyncConnection``), in alternating rounds (medians):

* ``async send 1/txn``: ``AsyncTransport.send`` in an ``AsyncSession``'s transaction (begin,
  send, commit) beside the driver's own transaction running the same INSERT; and, to show where
  the time goes, the same INSERT through SQLAlchemy's ``AsyncConnection`` (``engine.begin()``)
  natively and inside ``run_sync``, and our send on an ``AsyncConnection``;
* ``async send 500/txn``: ``send_many`` of 500 in an ``AsyncSession`` beside the driver's
  ``executemany`` of the same statement in a transaction;
* ``async recv 1/txn`` and ``async recv 10/txn``: ``AsyncTransport.receive`` in
  ``engine.begin()`` beside the same DELETE ... RETURNING in the driver's transaction; with 4
  consumers (``async recv N/txn, 4 consumers``), as many tasks of one event loop, each receiving
  until the queue is empty, beside as many tasks each on a connection of the driver's own;
* ``async endpoint c=1`` and ``c=8``: an ``AsyncEndpoint`` with a no-op async handler draining
  the queue (``run(once=True)``, its start included) beside a raw async worker loop: as many
  tasks, each on a connection of the driver's own, running the same receive statement in a
  transaction until the queue is empty.

Beside PGQueuer (its asyncpg driver, in the same event loop), 1 and 100 jobs a call:

* ``async enqueue N (asyncpg)``: ``send_many`` in an ``AsyncSession``'s transaction, and in a
  transaction of the transport's own, beside ``Queries.enqueue`` of one job or of lists (one
  statement, its own transaction);
* ``async dequeue+ack N (asyncpg)``: ``receive`` of N in ``engine.begin()``, and in a
  transaction of the transport's own (the DELETE is the acknowledgement, at the commit),
  beside PGQueuer's ``QueueManager.run(batch_size=N, mode=drain)`` with a handler recording
  the payload, from its first job handled to its return (its start-up not counted; its
  completion log, the acknowledgement, flushed).

Each side enqueues its round's share, then dequeues it, checked exactly once.

The raw side builds its rows inside the clock with the same NServiceBus headers
(:meth:`benchmarks.baselines.RawQueue.rows`) and parses each received row's headers with
``json.loads``, as the synchronous cells' raw sides do; it runs the very statement text the
transport rendered for that driver. Ours runs the synchronous core through ``run_sync``: the
ratio is what that bridge, SQLAlchemy's async engine and our layer cost together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import types
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from benchmarks import baselines, peers, workers, workload
from benchmarks.harness import Run
from benchmarks.workload import Result
from sqlqueue_orm.aio import AsyncEndpoint, AsyncHandlerContext, AsyncTransport

DRIVERS = ("asyncpg", "psycopg")
TARGET = 0.90
#: Jobs per call of the cells beside PGQueuer, and what ours must reach against it.
PGQUEUER_BATCHES = (1, 100)
PGQUEUER_TARGET = 1.5
RAW_TASKS = "raw async driver, as many tasks"
#: The send 1/txn cell's breakdown: the same INSERT through SQLAlchemy's AsyncConnection, natively
#: and through run_sync, and our send on an AsyncConnection instead of an AsyncSession.
#: The async endpoint cells' concurrencies.
ENDPOINT_CONCURRENCY = (1, 8)
RAW_WORKERS = "raw async worker loop"
SA_NATIVE = "SQLAlchemy AsyncConnection, same INSERT"
SA_RUN_SYNC = "SQLAlchemy AsyncConnection, same INSERT in run_sync"
OURS_CONNECTION = f"{workers.OURS} on an AsyncConnection"
#: Beside PGQueuer, whose enqueue is one statement committed on its own: ours likewise, each
#: send and receive in a transaction of the transport's own (no ``connection=``).
OURS_OWN = f"{workers.OURS}, a transaction of its own"


async def _timed(operations: int, per: int, operation: Callable[[], Awaitable[object]]
                 ) -> workload.Timing:
    clock = asyncio.get_running_loop().time
    latencies = []
    started = clock()
    for _ in range(operations):
        before = clock()
        await operation()
        latencies.append(clock() - before)
    return workload.Timing(operations * per, clock() - started, latencies)


class _RawAsync:
    """One connection of the raw async driver running the transport's statements."""

    def __init__(self, driver: str, connection: Any) -> None:
        self.driver = driver
        self.connection = connection

    @classmethod
    async def connect(cls, driver: str, dsn: str) -> _RawAsync:
        if driver == "asyncpg":
            import asyncpg

            return cls(driver, await asyncpg.connect(dsn))
        import psycopg

        return cls(driver, await psycopg.AsyncConnection.connect(dsn))

    async def send(self, text: str, rows: list[Any]) -> None:
        if self.driver == "asyncpg":
            async with self.connection.transaction():
                if len(rows) == 1:
                    await self.connection.execute(text, *rows[0])
                else:
                    await self.connection.executemany(text, rows)
            return
        async with self.connection.transaction(), self.connection.cursor() as cursor:
            if len(rows) == 1:
                await cursor.execute(text, rows[0])
            else:
                await cursor.executemany(text, rows)

    async def receive(self, text: str, params: Any) -> list[bytes]:
        if self.driver == "asyncpg":
            async with self.connection.transaction():
                rows = await self.connection.fetch(text, *params)
                return _bodies(rows)
        async with self.connection.transaction(), self.connection.cursor() as cursor:
            await cursor.execute(text, params)
            return _bodies(await cursor.fetchall())

    async def close(self) -> None:
        await self.connection.close()


def _bodies(rows: Any) -> list[bytes]:
    """Each row's headers parsed (as any consumer must), its body kept: (id, seq, expired,
    headers, body) as the receive returns them."""
    loads = json.loads
    bodies = []
    for row in rows:
        loads(row[3])
        bodies.append(bytes(row[4]))
    return bodies


def asyncio_scenario(run: Run) -> None:
    """The cells above, on PostgreSQL (aiosqlite has no raw peer worth the name here)."""
    if run.database.name != "postgresql":
        run.skip("async send 1/txn", workers.OURS, "asyncpg and psycopg async: PostgreSQL only")
        return
    for driver in DRIVERS:
        asyncio.run(_driver_cells(run, driver))
    peer = workers.PGQUEUER_ASYNCPG
    first = f"async enqueue {PGQUEUER_BATCHES[0]} (asyncpg)"
    if not run.peer_skipped(peer, first):
        with run.peer_failure(first, peer):
            peers.pgqueuer_install(run.database)
            asyncio.run(_pgqueuer_cells(run))


async def _driver_cells(run: Run, driver: str) -> None:
    url = run.database.url.replace("postgresql+psycopg://", f"postgresql+{driver}://", 1)
    transport = AsyncTransport(url)
    raw = await _RawAsync.connect(driver, run.database.raw_dsn)
    try:
        n = run.settings.messages
        for batch in (1, run.settings.batch):
            await _cell(run, transport, raw, driver, f"async send {batch}/txn ({driver})",
                        batch, n, sending=True)
        for per in run.settings.per_transaction:
            await _cell(run, transport, raw, driver, f"async recv {per}/txn ({driver})",
                        per, n, sending=False)
        for consumers in run.settings.consumers:
            if consumers > 1:
                for per in run.settings.per_transaction:
                    await _consumers_cell(run, transport, driver, per, consumers, n)
        for concurrency in ENDPOINT_CONCURRENCY:
            await _endpoint_cell(run, transport, driver, concurrency, n)
    finally:
        await raw.close()
        await transport.close()


Side = tuple[str, Callable[[str], Awaitable[workload.Timing]]]


async def _rounds(run: Run, transport: AsyncTransport, scenario: str, sides: list[Side],
                  rounds: int, share: int, sending: bool = False, look_up: bool = True
                  ) -> dict[str, workload.Timing]:
    """Each side's median of *rounds* alternating rounds, each on a fresh queue (filled with
    *share* messages unless *sending*, looked up before the clock if *look_up*), checked to
    hold exactly what was sent, or nothing, afterwards."""
    timings: dict[str, list[workload.Timing]] = {side: [] for side, _ in sides}
    for number in range(rounds):
        shift = number % len(sides)
        for side, function in sides[shift:] + sides[:shift]:
            queue = run.new_queue("aio")
            if not sending:
                run.fill(queue, share)
            if look_up:
                await transport.run(None, lambda c, q=queue: transport.transport.queues.first_use(
                    c, transport.transport.queues.table_queue(q)))
            timings[side].append(await function(queue))
            left = run.drain_bodies(queue)
            if sending:
                workload.check_exactly_once(left, range(share), f"{scenario} {side}")
            elif left:
                raise AssertionError(f"{scenario} {side}: {len(left)} message(s) left")
    return {side: workload.median_round(timings[side]) for side, _ in sides}


def _report(run: Run, scenario: str, medians: dict[str, workload.Timing], rounds: int,
            baseline: str, target: float, against: str) -> None:
    """One result a side, each but *baseline* with its ratio to it; ours aiming at *target*."""
    note = f"median of {rounds} alternating rounds"
    base_rate = medians[baseline].rate
    for side, timing in medians.items():
        result = Result.of(run.database.name, scenario, side, timing, note=note)
        if side != baseline:
            ratio = timing.rate / base_rate
            result = dataclasses.replace(result, note=f"{note}; {ratio:.2f}x {against}")
        if side == workers.OURS:
            result = result.aiming(f">= {target:.1f}x {against}",
                                   f"{result.rate:,.0f} msg/s, {ratio:.2f}x", ratio >= target)
        run.add(result)


async def _cell(run: Run, transport: AsyncTransport, raw: _RawAsync, driver: str,
                scenario: str, batch: int, n: int, sending: bool) -> None:
    rounds = max(1, min(run.settings.receive_rounds, n // batch))
    share = n // rounds // batch * batch
    sides: list[Side] = [
        (workers.OURS, lambda q: (_send_ours if sending else _receive_ours)(
            transport, q, batch, share)),
        (baselines.TRANSACTION, lambda q: (_send_raw if sending else _receive_raw)(
            transport, raw, q, batch, share)),
    ]
    if sending and batch == 1:  # where the time goes: the async engine, run_sync, the session
        sides += [
            (SA_NATIVE, lambda q: _send_engine(transport, q, share, through_run_sync=False)),
            (SA_RUN_SYNC, lambda q: _send_engine(transport, q, share, through_run_sync=True)),
            (OURS_CONNECTION, lambda q: _send_ours(transport, q, 1, share, session=False)),
        ]
    medians = await _rounds(run, transport, scenario, sides, rounds, share, sending=sending)
    _report(run, scenario, medians, rounds, baselines.TRANSACTION, TARGET,
            f"the raw {driver} transaction")


async def _consumers_cell(run: Run, transport: AsyncTransport, driver: str, per: int,
                          consumers: int, n: int) -> None:
    """``async recv N/txn, C consumers``: C tasks receiving ours beside C raw driver tasks."""
    scenario = f"async recv {per}/txn, {consumers} consumers ({driver})"
    rounds = max(1, min(run.settings.receive_rounds, n // per))
    share = n // rounds
    sides: list[Side] = [
        (workers.OURS, lambda q: _receive_tasks_ours(transport, q, per, consumers, share)),
        (RAW_TASKS, lambda q: _receive_tasks_raw(run, transport, driver, q, per, consumers,
                                                 share)),
    ]
    medians = await _rounds(run, transport, scenario, sides, rounds, share)
    _report(run, scenario, medians, rounds, RAW_TASKS, TARGET,
            f"{consumers} raw {driver} tasks")


async def _pgqueuer_cells(run: Run) -> None:
    """``async enqueue N`` and ``async dequeue+ack N`` beside PGQueuer, both on asyncpg."""
    url = run.database.url.replace("postgresql+psycopg://", "postgresql+asyncpg://", 1)
    transport = AsyncTransport(url)
    peer = workers.PGQUEUER_ASYNCPG
    try:
        for batch in PGQUEUER_BATCHES:
            enqueue = f"async enqueue {batch} (asyncpg)"
            dequeue = f"async dequeue+ack {batch} (asyncpg)"
            rounds = max(1, min(run.settings.receive_rounds, run.settings.messages // batch))
            share = run.settings.messages // rounds // batch * batch
            if not share:
                for scenario in (enqueue, dequeue):
                    run.skip(scenario, peer, f"fewer than {batch} messages a cell (--messages)")
                continue
            sent: dict[str, list[workload.Timing]] = {workers.OURS: [], OURS_OWN: [], peer: []}
            taken: dict[str, list[workload.Timing]] = {workers.OURS: [], OURS_OWN: [], peer: []}
            sides: list[tuple[str, Callable[..., Awaitable[tuple[workload.Timing,
                                                                 workload.Timing]]]]] = [
                (workers.OURS, _ours_round),
                (OURS_OWN, functools.partial(_ours_round, own=True)),
                (peer, _pgqueuer_round),
            ]
            for number in range(rounds):
                shift = number % len(sides)
                for side, function in sides[shift:] + sides[:shift]:
                    send_timing, receive_timing = await function(run, transport, batch, share)
                    sent[side].append(send_timing)
                    taken[side].append(receive_timing)
            for scenario, timings in ((enqueue, sent), (dequeue, taken)):
                medians = {side: workload.median_round(timings[side]) for side, _ in sides}
                _report(run, scenario, medians, rounds, peer, PGQUEUER_TARGET, "PGQueuer")
    finally:
        await transport.close()


async def _ours_round(run: Run, transport: AsyncTransport, batch: int, share: int,
                      own: bool = False) -> tuple[workload.Timing, workload.Timing]:
    """Ours: *share* messages sent *batch* a transaction, then received *batch* a transaction
    (in an ``AsyncSession`` and in ``engine.begin()``, or, *own*, in the transport's own)."""
    queue = run.new_queue("aiopgq")
    await transport.run(None, lambda c: transport.transport.queues.first_use(
        c, transport.transport.queues.table_queue(queue)))  # the look-up, before the clock
    sent = await _send_ours(transport, queue, batch, share, own=own)
    taken = await _receive_ours(transport, queue, batch, share, own=own)
    left = run.drain_bodies(queue)
    if left:
        raise AssertionError(f"async dequeue+ack {batch} ours: {len(left)} message(s) left")
    return sent, taken


async def _pgqueuer_round(run: Run, transport: AsyncTransport, batch: int, share: int
                          ) -> tuple[workload.Timing, workload.Timing]:
    """PGQueuer: *share* jobs enqueued *batch* a call, then drained by its QueueManager taking
    *batch* a dequeue; each round a fresh entrypoint, each on a connection of its own."""
    from pgqueuer.queries import Queries

    entrypoint = f"aio_{uuid.uuid4().hex[:8]}"
    driver, close = await peers.pgqueuer_driver(workers.PGQUEUER_ASYNCPG, run.database)
    try:
        queries = Queries(driver)
        sent = await peers.pgqueuer_enqueue(queries, entrypoint, 0, share, batch)
    finally:
        await close()
    driver, close = await peers.pgqueuer_driver(workers.PGQUEUER_ASYNCPG, run.database)
    try:
        _started, first, returned, sequences = await peers.pgqueuer_drain_here(
            driver, entrypoint, batch)
        left = await Queries(driver).queued_work([entrypoint])
    finally:
        await close()
    workload.check_exactly_once(sequences, range(share), f"async dequeue+ack {batch} PGQueuer")
    if left:
        raise AssertionError(f"async dequeue+ack {batch} PGQueuer: {left} job(s) left")
    return sent, workload.Timing(share, returned - first, [])


async def _send_ours(transport: AsyncTransport, queue: str, batch: int, count: int,
                     session: bool = True, own: bool = False) -> workload.Timing:
    messages = workload.outgoing(0, count)
    chunks = iter([messages[i:i + batch] for i in range(0, count, batch)])

    async def in_session() -> None:
        async with AsyncSession(transport.engine) as own, own.begin():
            await transport.send_many(queue, next(chunks), own)

    async def on_connection() -> None:
        async with transport.engine.begin() as connection:
            await transport.send_many(queue, next(chunks), connection)

    async def by_itself() -> None:
        await transport.send_many(queue, next(chunks))

    operation = by_itself if own else in_session if session else on_connection
    return await _timed(count // batch, batch, operation)


def _rows_of(transport: AsyncTransport, queue: str) -> tuple[str, Callable[[Any], list[Any]]]:
    """The send statement's text and the raw rows' builder for this driver."""
    table_queue = transport.transport.queues.table_queue(queue)
    # RawQueue.rows builds the rows (headers by the json module) for this driver's statement.
    shim = types.SimpleNamespace(send_statement=table_queue._send,
                                 to_driver=table_queue._text.id_to_driver)
    return table_queue._send.text, lambda messages: baselines.RawQueue.rows(shim, messages)  # type: ignore[arg-type]


async def _send_engine(transport: AsyncTransport, queue: str, count: int,
                       through_run_sync: bool) -> workload.Timing:
    text, rows = _rows_of(transport, queue)
    messages = iter(workload.outgoing(0, count))

    async def native() -> None:
        async with transport.engine.begin() as connection:
            await connection.exec_driver_sql(text, rows([next(messages)])[0])

    async def bridged() -> None:
        async with transport.engine.begin() as connection:
            row = rows([next(messages)])[0]
            await connection.run_sync(lambda sync: sync.exec_driver_sql(text, row))

    return await _timed(count, 1, bridged if through_run_sync else native)


async def _send_raw(transport: AsyncTransport, raw: _RawAsync, queue: str, batch: int,
                    count: int) -> workload.Timing:
    text, rows = _rows_of(transport, queue)
    messages = workload.outgoing(0, count)
    chunks = iter([messages[i:i + batch] for i in range(0, count, batch)])

    async def one() -> None:
        await raw.send(text, rows(next(chunks)))

    return await _timed(count // batch, batch, one)


async def _receive_ours(transport: AsyncTransport, queue: str, per: int, count: int,
                        own: bool = False) -> workload.Timing:
    got: list[int] = []

    async def one() -> None:
        if own:
            messages = await transport.receive(queue, per)
        else:
            async with transport.engine.begin() as connection:
                messages = await transport.receive(queue, per, connection)
        got.extend(workload.sequence_of(message.body) for message in messages)

    timing = await _timed(count // per, per, one)
    workload.check_exactly_once(got, range(count), f"async recv {per} ours")
    return timing


async def _receive_raw(transport: AsyncTransport, raw: _RawAsync, queue: str, per: int,
                       count: int) -> workload.Timing:
    statement, params, _many = transport.transport.queues.table_queue(queue)._receive_args(per)
    got: list[int] = []

    async def one() -> None:
        got.extend(workload.sequence_of(body) for body in await raw.receive(statement.text,
                                                                             params))

    timing = await _timed(count // per, per, one)
    workload.check_exactly_once(got, range(count), f"async recv {per} raw")
    return timing


async def _endpoint_cell(run: Run, transport: AsyncTransport, driver: str, concurrency: int,
                         n: int) -> None:
    """``async endpoint c=N``: the AsyncEndpoint beside N raw tasks, alternating rounds."""
    scenario = f"async endpoint c={concurrency} ({driver})"
    rounds = max(1, run.settings.receive_rounds)
    share = n // rounds
    sides: list[Side] = [
        (workers.OURS, lambda q: _endpoint_ours(transport, q, concurrency, share)),
        (RAW_WORKERS, lambda q: _receive_tasks_raw(run, transport, driver, q, 1, concurrency,
                                                   share)),
    ]
    medians = await _rounds(run, transport, scenario, sides, rounds, share, look_up=False)
    _report(run, scenario, medians, rounds, RAW_WORKERS, TARGET, f"a raw {driver} worker loop")


async def _endpoint_ours(transport: AsyncTransport, queue: str, concurrency: int, count: int
                         ) -> workload.Timing:
    endpoint = AsyncEndpoint(queue, transport, concurrency=concurrency, peek_delay=0.1,
                             delayed_delivery=False)

    @endpoint.handle_raw
    async def handle(body: bytes, context: AsyncHandlerContext) -> None:
        return None

    clock = asyncio.get_running_loop().time
    started = clock()
    await endpoint.run(once=True)
    elapsed = clock() - started
    if endpoint.stats.handled != count:
        raise AssertionError(f"async endpoint: {endpoint.stats.handled} of {count} handled")
    return workload.Timing(count, elapsed, [elapsed / max(1, count)])


async def _tasks(count: int, receivers: list[Callable[[], Awaitable[list[int]]]], what: str
                 ) -> workload.Timing:
    """One task a receiver, each calling it until it returns nothing; timed from the first
    start to the last end, every call's latency kept, checked exactly once."""
    clock = asyncio.get_running_loop().time
    got: list[int] = []
    latencies: list[float] = []

    async def work(receive: Callable[[], Awaitable[list[int]]]) -> None:
        while True:
            before = clock()
            numbers = await receive()
            latencies.append(clock() - before)
            if not numbers:
                return
            got.extend(numbers)

    started = clock()
    await asyncio.gather(*(work(receive) for receive in receivers))
    elapsed = clock() - started
    workload.check_exactly_once(got, range(count), what)
    return workload.Timing(count, elapsed, latencies)


async def _receive_tasks_ours(transport: AsyncTransport, queue: str, per: int, consumers: int,
                              count: int) -> workload.Timing:
    async def receive() -> list[int]:
        async with transport.engine.begin() as connection:
            messages = await transport.receive(queue, per, connection)
        return [workload.sequence_of(message.body) for message in messages]

    return await _tasks(count, [receive] * consumers, f"async recv {per} ours x{consumers}")


async def _receive_tasks_raw(run: Run, transport: AsyncTransport, driver: str, queue: str,
                             per: int, consumers: int, count: int) -> workload.Timing:
    statement, params, _many = transport.transport.queues.table_queue(queue)._receive_args(per)
    raws = [await _RawAsync.connect(driver, run.database.raw_dsn) for _ in range(consumers)]

    def receiver(raw: _RawAsync) -> Callable[[], Awaitable[list[int]]]:
        async def receive() -> list[int]:
            bodies = await raw.receive(statement.text, params)
            return [workload.sequence_of(body) for body in bodies]
        return receive

    try:
        return await _tasks(count, [receiver(raw) for raw in raws],
                            f"async recv {per} raw x{consumers}")
    finally:
        for raw in raws:
            await raw.close()
