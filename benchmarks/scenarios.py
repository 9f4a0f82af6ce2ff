"""What a run measures, each scenario with our side, the raw baselines and the peers together.

A scenario appends :class:`~benchmarks.workload.Result` rows; names are stable (the report and
the JSON key on them). Every receive checks that each message arrived exactly once, every send
that the table holds exactly what was sent. Sides of one scenario run one after another on the
same empty (or equally filled) queue.

The endpoint's scenarios are in :data:`ENDPOINT_SCENARIOS` (from ``bench_endpoint.py``: the
pump end to end per transaction mode beside a raw receive loop, the idle send-to-handler
latency by polling, NOTIFY and in-process wake-up); selected with ``--only pump``.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from benchmarks import (
    baselines,
    bench_asyncio,
    bench_batch,
    bench_cli,
    bench_endpoint,
    bench_failure_groups,
    bench_heartbeat,
    bench_snapshot,
    bench_wakeup,
    instrumentation,
    peers,
    workers,
    workload,
)
from benchmarks.harness import Run, Settings
from benchmarks.servers import Database
from benchmarks.workload import Result
from sqlqueue_orm import Transport, UnitOfWork
from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import OutboxOperation

# fork: a consumer starts in milliseconds, where spawn re-imports SQLAlchemy (seconds on a busy
# machine). Each child makes its own connections; none touches the parent's.
_SPAWN = multiprocessing.get_context("fork")


# -- send ---------------------------------------------------------------------------------------
def send(run: Run) -> None:
    """One message per transaction, and batches: ours, raw (both ways), the peers.

    As the receive cells do, the sides send the cell's messages in
    :attr:`Settings.receive_rounds` rounds of a share each (a multiple of the batch), taking
    turns, each round starting one side later; each side's figure is its median round.
    """
    n = run.settings.messages
    for batch in (1, run.settings.batch):
        scenario = f"send {batch}/txn"
        sides: list[tuple[str, Callable[[str, int], workload.Timing]]] = [
            (workers.OURS, lambda q, k, b=batch: _send_ours(run, q, b, k)),
            (baselines.TRANSACTION, lambda q, k, b=batch: _send_raw(run, q, b, False, k)),
        ]
        if batch == 1:
            sides.insert(1, (baselines.AUTOCOMMIT, lambda q, k: _send_raw(run, q, 1, True, k)))
        rounds = max(1, min(run.settings.receive_rounds, n // batch))
        share = n // rounds // batch * batch
        timings: dict[str, list[workload.Timing]] = {side: [] for side, _ in sides}
        for number in range(rounds):
            for side, function in sides[number % len(sides):] + sides[:number % len(sides)]:
                queue = run.new_queue("send")
                timings[side].append(function(queue, share))
                workload.check_exactly_once(
                    run.drain_bodies(queue), range(share), f"{scenario} {side}"
                )
        note = f"median of {rounds} alternating rounds" if rounds > 1 else ""
        for side, _ in sides:
            run.add(Result.of(run.database.name, scenario, side,
                              workload.median_round(timings[side]), note=note))
        _send_peers(run, scenario, batch)


def _send_ours(run: Run, queue: str, batch: int, count: int) -> workload.Timing:
    messages = workload.outgoing(0, count)
    transport = run.transport
    workload.warm_up(transport, queue)
    if batch == 1:
        iterator = iter(messages)
        return workload.timed(len(messages), 1, lambda: transport.send(queue, next(iterator)))
    chunks = iter([messages[i:i + batch] for i in range(0, len(messages), batch)])
    return workload.timed(len(messages) // batch, batch,
                          lambda: transport.send_many(queue, next(chunks)))


def _send_raw(run: Run, queue: str, batch: int, autocommit: bool, count: int) -> workload.Timing:
    raw = baselines.RawQueue(run.database, queue, autocommit)
    messages = workload.outgoing(0, count)
    # The rows (headers by the json module) are built inside the clock, as ours are.
    chunks = iter([messages[i:i + batch] for i in range(0, len(messages), batch)])
    timing = workload.timed(len(messages) // batch, batch,
                            lambda: raw.send_messages(next(chunks)))
    raw.close()
    return timing


def _send_peers(run: Run, scenario: str, batch: int) -> None:
    n = run.settings.messages
    if batch == 1 and not run.peer_skipped(workers.KOMBU, scenario):
        with run.peer_failure(scenario, workers.KOMBU):
            run.add(_in_child(_send_kombu, run.database, run.settings.peer_messages, scenario))
    elif batch != 1 and run.settings.peers:
        run.skip(scenario, workers.KOMBU, "kombu has no batch send")
    n = min(run.settings.peer_messages, n)
    for peer in (workers.PGQUEUER_ASYNCPG, workers.PGQUEUER_PSYCOPG):
        if run.peer_skipped(peer, scenario):
            continue
        with run.peer_failure(scenario, peer):
            peers.pgqueuer_install(run.database)
            entrypoint = f"send_{uuid.uuid4().hex[:6]}"
            timing = peers.pgqueuer_send(peer, run.database, entrypoint, 0, n, batch)
            drained = _pgqueuer_consume(run, peer, entrypoint, 1, 10)
            workload.check_exactly_once(drained[4], range(n), f"{scenario} {peer}")
            run.add(Result.of(run.database.name, scenario, peer, timing))


def _send_kombu(database: Database, n: int, scenario: str) -> Result:
    queue = f"kombu_send_{uuid.uuid4().hex[:6]}"
    sender, close = peers.kombu_sender(database, queue)
    sender(workload.body(0))  # creates kombu's tables and queue row before the clock
    numbers = iter(range(1, n + 1))
    timing = workload.timed(n, 1, lambda: sender(workload.body(next(numbers))))
    close()
    receive, close = peers.kombu_receiver(database, queue)
    got = []
    while bodies := receive():
        got.extend(workload.sequence_of(body) for body in bodies)
    close()
    workload.check_exactly_once(got, range(n + 1), f"{scenario} kombu")
    return Result.of(database.name, scenario, workers.KOMBU, timing)


def _fill_kombu(database: Database, queue: str, n: int) -> None:
    sender, close = peers.kombu_sender(database, queue)
    for number in range(n):
        sender(workload.body(number))
    close()


# -- receive ------------------------------------------------------------------------------------
def receive(run: Run) -> None:
    """1 and 4 consumer processes, 1 and 10 messages per transaction.

    Ours and the raw loops move the cell's messages in :attr:`Settings.receive_rounds` rounds
    of a share each, the sides taking turns (each round starting one side later), and each
    side's figure is its median round (latencies of every round): a ratio of sides measured
    minutes apart moved by whatever else the machine did in between.
    """
    n = run.settings.messages
    rounds = max(1, min(run.settings.receive_rounds, n))
    for consumers in run.settings.consumers:
        for per_transaction in run.settings.per_transaction:
            scenario = f"receive {per_transaction}/txn, {consumers} consumer(s)"
            sides = [workers.OURS, workers.OURS_TX, workers.OURS_KEPT, baselines.AUTOCOMMIT,
                     baselines.TRANSACTION]
            timings: dict[str, list[workload.Timing]] = {side: [] for side in sides}
            for number in range(rounds):
                share = n // rounds + (1 if number < n % rounds else 0)
                for side in sides[number % len(sides):] + sides[:number % len(sides)]:
                    queue = run.new_queue("recv")
                    run.fill(queue, share)
                    timings[side].append(_consume(run, side, queue, consumers, per_transaction,
                                                  share))
            note = f"median of {rounds} alternating rounds" if rounds > 1 else ""
            for side in sides:
                run.add(Result.of(run.database.name, scenario, side,
                                  workload.median_round(timings[side]), note=note))
            if per_transaction == 1:
                _receive_kombu(run, scenario, consumers)
            elif run.settings.peers:
                run.skip(scenario, workers.KOMBU, "kombu receives one message at a time")
            for peer in (workers.PGQUEUER_ASYNCPG, workers.PGQUEUER_PSYCOPG):
                if run.peer_skipped(peer, scenario):
                    continue
                with run.peer_failure(scenario, peer):
                    _receive_pgqueuer(run, scenario, peer, consumers, per_transaction)


def _receive_kombu(run: Run, scenario: str, consumers: int) -> None:
    if run.peer_skipped(workers.KOMBU, scenario):
        return
    with run.peer_failure(scenario, workers.KOMBU):
        queue = f"kombu_recv_{uuid.uuid4().hex[:6]}"
        _in_child(_fill_kombu, run.database, queue, run.settings.peer_messages)
        timing = _consume(run, workers.KOMBU, queue, consumers, 1, run.settings.peer_messages)
        run.add(Result.of(run.database.name, scenario, workers.KOMBU, timing))


def _receive_pgqueuer(run: Run, scenario: str, peer: str, consumers: int,
                      per_transaction: int) -> None:
    n = run.settings.peer_messages
    peers.pgqueuer_install(run.database)
    entrypoint = f"recv_{uuid.uuid4().hex[:6]}"
    peers.pgqueuer_send(peer, run.database, entrypoint, 0, n, 500)
    result = _pgqueuer_consume(run, peer, entrypoint, consumers, per_transaction)
    workload.check_exactly_once(result[4], range(n), f"{scenario} {peer}")
    timing = workload.Timing(result[2], result[1] - result[0], [])
    run.add(Result.of(run.database.name, scenario, peer, timing,
                      note="its own QueueManager loop, first to last job handled "
                      "(start-up and drain-shutdown not counted); no per-receive latency"))


def _processes(target: Callable[..., None], args: tuple[Any, ...], count: int) -> list[Any]:
    barrier = _SPAWN.Barrier(count)
    out = _SPAWN.Queue()
    processes = [_SPAWN.Process(target=target, args=(*args, barrier, out)) for _ in range(count)]
    for process in processes:
        process.start()
    reports = []
    try:
        for _ in processes:
            report = out.get(timeout=900)
            if isinstance(report, BaseException):
                barrier.abort()  # the others stop waiting for the one that failed
            reports.append(report)
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.terminate()
    for report in reports:
        if isinstance(report, BaseException):
            raise report
    return reports


def _in_child(function: Callable[..., Any], *args: Any) -> Any:
    """Run *function* in a forked child: a peer's cached engines never reach later children."""
    return _processes(_call, (function, args), 1)[0]


def _call(function: Callable[..., Any], args: tuple[Any, ...], barrier: Any, out: Any) -> None:
    try:
        out.put(function(*args))
    except BaseException as error:
        out.put(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        raise


def _consume(run: Run, side: str, queue: str, consumers: int, per_transaction: int,
             messages: int | None = None) -> workload.Timing:
    reports = _processes(workers.consume, (side, run.database, queue, per_transaction),
                         consumers)
    sequences = [number for report in reports for number in report[4]]
    workload.check_exactly_once(sequences, range(messages or run.settings.messages),
                                f"receive {side} x{consumers}")
    return workload.merge(reports)


def _pgqueuer_consume(run: Run, peer: str, entrypoint: str, consumers: int,
                      per_transaction: int) -> tuple[float, float, int, list[float], list[int]]:
    reports = _processes(workers.consume_pgqueuer, (peer, run.database, entrypoint,
                                                    per_transaction), consumers)
    return (min(r[0] for r in reports), max(r[1] for r in reports), sum(r[2] for r in reports),
            [], [number for report in reports for number in report[4]])


# -- outbox -------------------------------------------------------------------------------------
def outbox(run: Run) -> None:
    """A unit of work with one send (outbox vs direct), and the dispatcher draining a backlog."""
    transport = run.transport
    store = UnitOfWork(transport).outbox
    store.create_table()
    units = max(1, run.settings.messages // 5)
    scenario = "unit of work, 1 send"
    for mode in ("direct", "outbox"):
        queue = run.new_queue("uow")
        timing = _units(transport, queue, mode, units)
        workload.check_exactly_once(run.drain_bodies(queue), range(units), f"{scenario} {mode}")
        run.add(Result.of(run.database.name, scenario, f"{workers.OURS} {mode}", timing))

    scenario = "outbox dispatcher, backlog"
    queue = run.new_queue("dispatch")
    n = run.settings.messages
    with transport.engine.begin() as connection:
        records = []
        for message in workload.outgoing(0, n):
            prepared = message.prepare()
            records.append((str(uuid.uuid4()),
                            [OutboxOperation.from_prepared(queue, prepared)]))
        store.store_many(connection, records)
    dispatcher = OutboxDispatcher(store, DispatcherSettings(grace_period=0))
    clock = time.perf_counter
    latencies = []
    started = clock()
    while True:
        before = clock()
        report = dispatcher.dispatch_batch()
        if report.claimed:
            latencies.append(clock() - before)
        if report.claimed < dispatcher.settings.batch_size:
            break
    timing = workload.Timing(n, clock() - started, latencies)
    workload.check_exactly_once(run.drain_bodies(queue), range(n), scenario)
    run.add(Result.of(run.database.name, scenario, workers.OURS, timing,
                      note=f"{dispatcher.settings.batch_size} records per transaction"))


def _units(transport: Transport, queue: str, mode: str, units: int) -> workload.Timing:
    messages = iter(workload.outgoing(0, units))

    def unit() -> None:
        with UnitOfWork(transport, mode=mode) as uow:  # type: ignore[arg-type]
            uow.send(queue, next(messages))

    return workload.timed(units, 1, unit)


# -- depth --------------------------------------------------------------------------------------
def depth(run: Run) -> None:
    """Peek time and receive rate with few and with many messages waiting."""
    settings = run.settings
    for waiting in (settings.shallow, settings.deep):
        _depth_at(run, waiting)


def _depth_at(run: Run, waiting: int) -> None:
    settings = run.settings
    transport = run.transport
    queue = run.new_queue("depth")
    started = time.perf_counter()
    taken = min(settings.depth_receives, waiting // 2)
    run.fill(queue, min(waiting, 2 * taken))  # the oldest: these are received and checked
    run.replicate(queue, waiting)
    run.log(f"  {run.database.name:10} filled {waiting:,} in "
            f"{time.perf_counter() - started:.0f} s")
    scenario = f"{waiting:,} waiting"
    workload.warm_up(transport, queue)
    peek = workload.timed_for(settings.peek_calls, 5.0, lambda: transport.peek(queue))
    run.add(Result.of(run.database.name, f"peek, {scenario}", workers.OURS, peek,
                      note="rate = peeks/s"))
    got: list[int] = []

    def take() -> None:
        got.extend(workload.sequence_of(m.body) for m in transport.receive(queue))

    timing = workload.timed(taken, 1, take)
    workload.check_exactly_once(got, range(taken), f"receive, {scenario}")
    run.add(Result.of(run.database.name, f"receive 1/txn, {scenario}", workers.OURS, timing))
    raw = baselines.RawQueue(run.database, queue, autocommit=True)
    raw_got: list[int] = []

    def take_raw() -> None:
        raw_got.extend(workload.sequence_of(body) for body in raw.receive(1))

    timing = workload.timed(taken, 1, take_raw)
    raw.close()
    workload.check_exactly_once(raw_got, range(taken, 2 * taken), f"raw receive, {scenario}")
    run.add(Result.of(run.database.name, f"receive 1/txn, {scenario}", baselines.AUTOCOMMIT,
                      timing))
    transport.purge_all(queue)


# -- snapshot -----------------------------------------------------------------------------------
def snapshot(run: Run) -> None:
    """The burn-down without and with an old snapshot held (``bench_snapshot.py``)."""
    bench_snapshot.snapshot_scenario(run)


# -- migrate ------------------------------------------------------------------------------------
def migrate(run: Run) -> None:
    """``sqlqueue migrate`` on a v1-era queue table holding ``migrate_rows`` messages."""
    from testsupport import legacy

    rows = run.settings.migrate_rows
    table = f"bench_v1_{uuid.uuid4().hex[:6]}"
    engine = run.transport.engine
    with engine.begin() as connection:
        legacy.create(connection, "v1", table, None)
    with engine.begin() as connection:
        legacy.insert(connection, table, None, legacy.messages(min(rows, 10_000), seed=1))
    run.replicate(table, rows)
    command = [sys.executable, "-m", "sqlqueue_orm.cli", "--url", run.database.url, "migrate",
               "--queues", table]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, check=False,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(f"sqlqueue migrate failed: {completed.stderr.strip()[-500:]}")
    quoted = engine.dialect.identifier_preparer.quote(table)
    with engine.connect() as connection:
        count = connection.execute(sa.text(f"SELECT count(*) FROM {quoted}")).scalar_one()
    if count != rows:
        raise AssertionError(f"migrate: {rows} rows before, {count} after")
    run.add(Result.of(run.database.name, f"migrate v1 table, {rows:,} rows", "sqlqueue migrate",
                      workload.Timing(rows, seconds, [seconds]),
                      note="rate = rows/s; includes the CLI's start-up"))


#: The endpoint's scenarios (``--only pump``): the pump end to end per transaction mode beside a
#: raw receive loop, and the idle send-to-handler latency by each wake-up.
ENDPOINT_SCENARIOS: list[tuple[str, Callable[[Run], None]]] = [
    ("pump", bench_endpoint.pump_scenario), ("wake-up", bench_endpoint.wakeup_scenario),
]

ALL: list[tuple[str, Callable[[Run], None]]] = [
    ("send", send), ("receive", receive), ("outbox", outbox), ("depth", depth),
    ("migrate", migrate), ("instrumentation", instrumentation.instrumentation_cost),
    ("snapshot", snapshot), ("heartbeat", bench_heartbeat.heartbeat_scenario),
    ("groups", bench_failure_groups.groups_scenario), ("cli", bench_cli.startup_scenario),
]


def run_all(database: Database, settings: Settings, results: list[Result],
            log: Callable[[str], None]) -> None:
    """Every selected scenario on *database*; a failing scenario is reported, not fatal."""
    run = Run(database, settings, results, log)
    try:
        for name, function in [
            *ALL,
            *(("pump", f) for _, f in ENDPOINT_SCENARIOS),
            ("batch", bench_batch.batch_scenario),
            ("wakeup", bench_wakeup.wakeup_scenario),
            ("asyncio", bench_asyncio.asyncio_scenario),
        ]:
            if name not in settings.only:
                continue
            started = time.perf_counter()
            try:
                function(run)
            except Exception as error:
                run.skip(name, "(scenario)", f"failed: {type(error).__name__}: {error}")
                if os.environ.get("SQLQUEUE_BENCH_STRICT"):
                    raise
            log(f"  {database.name:10} {name} took {time.perf_counter() - started:.0f} s")
    finally:
        run.close()
