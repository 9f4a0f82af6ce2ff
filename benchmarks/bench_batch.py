"""Batched pump and flow-control benchmarks, PostgreSQL.

Scenario ``batch`` of ``python -m benchmarks`` (``--burn-down N`` sets the backlog, default
1,000,000; ``--quick`` uses 100,000). Two cells on the same backlog, filled untimed
(5,000 sends, then copied on the server):

* the endpoint pump, TRANSACTION_SCOPE, ``batch_size`` :data:`BATCH`, :data:`THREADS` workers,
  an empty handler;
* a raw driver loop on as many threads running the same statements per batch: BEGIN, one
  receive with the row limit :data:`BATCH`, COMMIT (a handler's SAVEPOINT opens only when it
  first reaches the database: empty handlers have none).

:data:`ROUNDS` rounds, each draining a fresh backlog with both, alternating which goes first;
the ratio is the median of the rounds' ratios, best against best printed beside it.

Printed beside them: the targets (:data:`TARGET`) and the peers' published batched rates per core
(:data:`PEERS`), for scale.

Then the flow-control cost: the pump draining ``settings.messages`` keyed messages with the
rate limit, the global limit and the per-key limit all far above the load, beside the same pump
without them, unbatched and batched (target: under 10% off; :func:`flow_cost`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import sqlalchemy as sa

from benchmarks import workers, workload
from benchmarks.servers import Database
from benchmarks.workload import Result
from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint, TransactionMode
from testsupport import pg_cluster

if TYPE_CHECKING:
    from benchmarks.harness import Run

BATCH = 100
THREADS = 4
#: Rounds of each side, alternating which runs first. Each round's ratio compares two drains
#: run one after the other, and the median of the rounds' ratios is the figure: on a shared
#: machine one drain varies widely from the next, so best against best mostly measures luck,
#: and single rounds spread too far for a median of fewer rounds to hold from run to run.
ROUNDS = 5
TARGET = "target >= 15,000 msg/s (2 cores) and >= 0.9x the raw loop"
#: The peers' published batched rates, per core (graphile-worker on 8 performance cores, River
#: on an 8-core M2; neither states fsync; both with the database on the same box).
PEERS = "published, per core: graphile-worker 23,000, River 5,800 (8 cores each)"


def raw_batched_loop(transport: Transport, queue: str, threads: int, batch: int) -> int:
    """Drain *queue* with the batched pump's statements, no pump: messages taken."""
    taken = [0] * threads

    def work(index: int) -> None:
        while True:
            with transport.engine.connect() as connection:
                transaction = connection.begin()
                messages = transport.receive(queue, batch, connection=connection)
                if not messages:
                    transaction.rollback()
                    return
                transaction.commit()  # empty handlers: no SAVEPOINT (opened on first write)
            taken[index] += len(messages)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(taken)


def _fill(
    run: Run, queue: str, n: int, headers: Callable[[int], dict[str, str]] | None = None
) -> None:
    """*n* messages waiting in *queue*, then VACUUM and CHECKPOINT: each drain starts on a
    clean table and a fresh checkpoint.

    Without the CHECKPOINT a drain meets the server's own at a random moment (every 5
    minutes, or when the fill's WAL passes ``max_wal_size``): its buffer writes, and the
    full-page images every first change of a page after it adds to the WAL, fall on whichever
    side is draining then. After it, every drain writes the same WAL for the same work.
    """
    run.fill_backlog(queue, n, headers)
    table = run.transport.queues.table_queue(queue).quoted_table.replace("%%", "%")
    with run.transport.engine.connect().execution_options(
        isolation_level="AUTOCOMMIT"
    ) as connection:
        connection.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
        try:
            connection.exec_driver_sql("CHECKPOINT")
        except sa.exc.DBAPIError as error:  # not superuser or pg_checkpoint: drains as they come
            print(f"  (no CHECKPOINT before the drain: {error.orig})")


@dataclasses.dataclass
class Side:
    """One drain of the backlog: wall seconds and where the time went."""

    seconds: float
    #: CPU seconds of this (client) process, all its threads.
    client_cpu: float
    #: CPU seconds of the server's processes (None: not our cluster, /proc not readable).
    server_cpu: float | None
    #: WAL flushes (``pg_stat_wal.wal_sync``: each a commit's fsync, shared by group commit).
    wal_syncs: int
    load: float


def _server_cpu(run: Run) -> float | None:
    """CPU seconds used so far by the postmaster of *run*'s server and its children (Linux
    /proc; None when its data directory cannot be read here: another machine, no rights)."""
    try:
        with run.transport.engine.connect() as connection:
            directory = connection.exec_driver_sql("SHOW data_directory").scalar_one()
        with open(os.path.join(directory, "postmaster.pid")) as pid_file:
            postmaster = pid_file.readline().strip()
        ticks = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat_file:
                    fields = stat_file.read().rpartition(")")[2].split()
            except OSError:
                continue  # gone meanwhile
            # fields[1] is the parent pid; [11] and [12] user and system ticks (proc(5))
            if entry == postmaster or fields[1] == postmaster:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, sa.exc.DBAPIError):
        return None


def _wal_syncs(run: Run) -> int:
    with run.transport.engine.connect() as connection:
        return int(connection.exec_driver_sql("SELECT wal_sync FROM pg_stat_wal").scalar_one())


def _measured(run: Run, drain: Callable[[], float]) -> Side:
    """Run *drain* (it returns the seconds it drained for), measuring the client's and the
    server's CPU and the WAL flushes meanwhile."""
    syncs, server, client = _wal_syncs(run), _server_cpu(run), os.times()
    seconds = drain()
    after = os.times()
    server_after = _server_cpu(run)
    return Side(
        seconds,
        after.user + after.system - client.user - client.system,
        None if server is None or server_after is None else server_after - server,
        _wal_syncs(run) - syncs,
        os.getloadavg()[0],
    )


def _drain_raw(run: Run, queue: str, n: int) -> float:
    began = time.perf_counter()
    taken = raw_batched_loop(run.transport, queue, THREADS, BATCH)
    seconds = time.perf_counter() - began
    if taken != n:
        raise AssertionError(f"raw batched loop took {taken} of {n}")
    return seconds


def _drain_pump(run: Run, queue: str, n: int) -> float:
    """Seconds from the pump's start to its *n*-th handled message (its stop is not timed)."""
    endpoint = Endpoint(
        queue,
        run.transport,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        concurrency=THREADS,
        batch_size=BATCH,
        batch_flush=0.05,
        peek_delay=0.1,
        delayed_delivery=False,
    )
    # The handler counts its runs and wakes this thread at the n-th: a thread polling every few
    # ms would take the GIL from the workers as often (the raw loop's thread only joins).
    runs = itertools.count(1)
    last = threading.Event()

    def handle(body: bytes, context: object) -> None:
        if next(runs) >= n:
            last.set()

    endpoint.handle_raw(handle)
    began = time.perf_counter()
    endpoint.start()
    try:
        deadline = began + 3_600
        while not last.wait(1.0) and not endpoint.stats.failed:
            if time.perf_counter() > deadline:
                break
        while endpoint.stats.handled < n:  # then until its batch commits
            if time.perf_counter() > deadline or endpoint.stats.failed:
                raise AssertionError(f"batched pump: {endpoint.stats}")
            time.sleep(0.001)
        seconds = time.perf_counter() - began
    finally:
        endpoint.stop(10)
    if endpoint.stats.handled != n or run.count(queue):
        raise AssertionError(f"batched pump: {endpoint.stats}, {run.count(queue)} left")
    return seconds


def burn_down(run: Run, queue: str, n: int) -> tuple[list[Side], list[Side]]:
    """(pump rounds, raw loop rounds) draining a backlog of *n*, :data:`ROUNDS` each.

    The sides alternate (raw, pump, then pump, raw, ...), each on a freshly filled table, so
    neither always runs first on a shared, loaded machine.
    """
    pumped: list[Side] = []
    raw: list[Side] = []
    for number in range(ROUNDS):
        order = ("raw", "pump") if number % 2 == 0 else ("pump", "raw")
        for side in order:
            _fill(run, queue, n)
            drain = _drain_raw if side == "raw" else _drain_pump
            measured = _measured(run, lambda drain=drain: drain(run, queue, n))
            (raw if side == "raw" else pumped).append(measured)
            run.log(
                f"    round {number + 1} {side}: {n / measured.seconds:,.0f} msg/s, "
                f"load {measured.load:.1f}"
            )
    return pumped, raw


@contextlib.contextmanager
def _durable(run: Run) -> Iterator[tuple[Run, str]]:
    """A Run on a PostgreSQL with fsync on: a cluster of its own (the benchmark's runs fsync
    off), or ``$SQLQUEUE_BENCH_POSTGRES_URL``'s server as it is configured."""
    if os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL"):
        with run.transport.engine.connect() as connection:
            fsync = connection.exec_driver_sql("SHOW fsync").scalar_one()
            synchronous = connection.exec_driver_sql("SHOW synchronous_commit").scalar_one()
        yield run, f"your server: fsync {fsync}, synchronous_commit {synchronous}"
        return
    cluster = pg_cluster.start(durable=True)
    name = f"sqlqueue_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(cluster.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    database = Database("postgresql", cluster.url(name), "PostgreSQL, fsync on")
    durable = type(run)(database, run.settings, run.results, run.log)
    try:
        yield durable, "a cluster of its own, fsync and synchronous_commit on"
    finally:
        durable.close()
        cluster.stop()


def _range(rates: list[float]) -> str:
    low, high = min(rates), max(rates)
    return f"{high:,.0f}" if len(rates) == 1 else f"{low:,.0f} to {high:,.0f}"


def _where(sides: list[Side], n: int) -> str:
    """Per message: client CPU, server CPU (when known), WAL flushes; the load averages."""
    client = sum(side.client_cpu for side in sides) / (n * len(sides)) * 1e6
    servers = [side.server_cpu for side in sides if side.server_cpu is not None]
    server = f", server {sum(servers) / (n * len(servers)) * 1e6:.1f}" if servers else ""
    syncs = sum(side.wal_syncs for side in sides) / len(sides)
    loads = ", ".join(f"{side.load:.1f}" for side in sides)
    return (
        f"CPU us/msg: client {client:.1f}{server}; {syncs:,.0f} WAL flushes per drain; "
        f"load {loads}"
    )


def _floored(ratio: float) -> str:
    """*ratio* to 3 decimals, rounded down: printed beside an "at least" target, 0.8996 must
    not read 0.900 next to a NO."""
    return f"{math.floor(ratio * 1000) / 1000:.3f}"


def _cpu_per_message(sides: list[Side]) -> float | None:
    """Client plus server CPU seconds per drain (None: the server's is not known)."""
    if any(side.server_cpu is None for side in sides):
        return None
    return sum(side.client_cpu + (side.server_cpu or 0.0) for side in sides) / len(sides)


def batch_scenario(run: Run) -> None:
    """The batched pump beside the raw batched loop, burning down ``settings.burn_down`` on
    PostgreSQL with fsync on; and the cost of flow limits far above the load (:func:`flow_cost`)."""
    scenario = "batched burn-down, empty handlers"
    if run.database.name != "postgresql":
        run.skip(scenario, workers.PUMP, "PostgreSQL only")
        return
    run.transport.create_queue("error")
    flow_cost(run)
    n = run.settings.burn_down
    with _durable(run) as (durable, server):
        queue = durable.new_queue("batch")
        pumped, raw = burn_down(durable, queue, n)
    cores = os.cpu_count() or 1
    ours = [n / side.seconds for side in pumped]
    theirs = [n / side.seconds for side in raw]
    best = max(ours)
    ratios = sorted(mine / other for mine, other in zip(ours, theirs, strict=True))
    ratio = ratios[len(ratios) // 2]
    # both processes share the 2 cores: CPU per message is steadier than wall time there
    ours_cpu, theirs_cpu = _cpu_per_message(pumped), _cpu_per_message(raw)
    cpu = (
        ""
        if ours_cpu is None or theirs_cpu is None
        else f"; by CPU per message, client and server, {theirs_cpu / ours_cpu:.2f}x"
    )
    result = Result.of(
        run.database.name,
        scenario,
        f"{workers.PUMP} (batch {BATCH})",
        workload.Timing(n, n / best, []),
        note=f"{n:,} waiting, {THREADS} workers, {server}; {len(ours)} rounds alternating with "
        f"the raw loop: {_range(ours)} msg/s, {best / cores:,.0f} msg/s per core; "
        f"{ratio:.2f}x the raw loop (median of the rounds {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"best against best {best / max(theirs):.2f}x{cpu}); "
        f"{_where(pumped, n)}; {TARGET}; {PEERS}",
    )
    run.log(f"    pump: {result.note}")
    run.log(f"    raw loop: {_range(theirs)} msg/s; {_where(raw, n)}")
    run.add(
        result.aiming(
            TARGET,
            f"{best:,.0f} msg/s ({_range(ours)}), {_floored(ratio)}x the raw loop, fsync on",
            best >= 15_000 and ratio >= 0.9,
        )
    )
    run.add(
        Result.of(
            run.database.name,
            scenario,
            f"raw batched loop (batch {BATCH})",
            workload.Timing(n, n / max(theirs), []),
            note=f"the pump's statements on {THREADS} threads, no pump; {_range(theirs)} msg/s; "
            f"{_where(raw, n)}",
        )
    )


#: The flow-control settings of the cost cell: limits far above what the load can reach.
FAR_LIMITS: dict[str, object] = {
    "rate_limit": 1_000_000,
    "rate_burst": 1_000,
    "global_concurrency": 1_000,
    "key_header": "customer",
    "key_concurrency": 1_000,
}


#: Rounds of the flow cell, each a drain without limits and one with them, alternating which
#: goes first: on a shared machine one drain differs widely from the next, so each round's ratio
#: compares neighbours, the median is the figure and the spread is printed. Fewer rounds let the
#: median of the same code move by more than the 10% the target allows.
FLOW_ROUNDS = 15
FLOW_TARGET = ">= 0.90x the pump without limits (under 10% off)"


def _keyed(index: int) -> dict[str, str]:
    return {"customer": f"c{index % 100}"}


def _drain(run: Run, queue: str, n: int, flow: dict[str, object], batch: int = 1) -> float:
    """Seconds the pump (TRANSACTION_SCOPE, THREADS workers, empty handler) takes to drain the
    *n* keyed messages :func:`_fill` left (100 keys in turn), with the *flow* settings and
    *batch* messages per transaction."""
    batching: dict[str, object] = {"batch_size": batch, "batch_flush": 0.05} if batch > 1 else {}
    endpoint = Endpoint(
        queue,
        run.transport,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        concurrency=THREADS,
        peek_delay=0.1,
        delayed_delivery=False,
        **batching,
        **flow,
    )
    endpoint.handle_raw(lambda body, context: None)
    began = time.perf_counter()
    endpoint.start()
    try:
        while endpoint.stats.handled < n:
            if time.perf_counter() > began + 600 or endpoint.stats.failed:
                raise AssertionError(f"flow cell: {endpoint.stats}")
            time.sleep(0.005)
        return time.perf_counter() - began
    finally:
        endpoint.stop()


def flow_cost(run: Run) -> None:
    """The pump with every flow limit set far above the load, beside the pump without them.

    Unbatched (4 x ``settings.messages``) and with ``batch_size`` :data:`BATCH` (a fifth of
    ``settings.burn_down``: a drain of a second or more, not mostly start and stop),
    :data:`FLOW_ROUNDS` rounds each (which side goes first alternates), each drain on a freshly
    filled, vacuumed and checkpointed table; the ratio quoted is the median of the rounds'
    (each round: the two drains run one after the other), with the range and the ratio of CPU
    per message (client and server, all rounds) beside it.
    """
    scenario = "flow control, limits far above the load"
    queue = run.new_queue("flow")
    run.transport.create_queue("error")
    for batch in (1, BATCH):
        n = run.settings.messages * 4 if batch == 1 else max(1, run.settings.burn_down // 5)
        plain_sides: list[Side] = []
        limited_sides: list[Side] = []
        sides = [({}, plain_sides), (FAR_LIMITS, limited_sides)]
        for number in range(FLOW_ROUNDS):
            for flow, drains in sides if number % 2 == 0 else sides[::-1]:
                _fill(run, queue, n, _keyed)
                drains.append(_measured(run, functools.partial(_drain, run, queue, n, flow, batch)))
        plain = [side.seconds for side in plain_sides]
        limited = [side.seconds for side in limited_sides]
        ratios = sorted(ours / theirs for ours, theirs in zip(plain, limited, strict=True))
        ratio = ratios[len(ratios) // 2]
        # the cost in CPU too (client and server): steadier than wall time on a shared machine
        plain_cpu, limited_cpu = _cpu_per_message(plain_sides), _cpu_per_message(limited_sides)
        cpu = (
            ""
            if plain_cpu is None or limited_cpu is None
            else f"; by CPU per message, client and server, {plain_cpu / limited_cpu:.2f}x"
        )
        shown = "" if batch == 1 else f" (batch {batch})"
        measured = (f"{'unbatched' if batch == 1 else f'batch {batch}'}: {_floored(ratio)}x "
                    f"(rounds {ratios[0]:.2f}-{ratios[-1]:.2f}, {n:,} messages{cpu})")
        run.add(
            Result.of(
                run.database.name,
                scenario,
                f"{workers.PUMP} with rate, global and per-key limits{shown}",
                workload.Timing(n, sorted(limited)[len(limited) // 2], []),
                note=f"{measured} of the pump without limits ({FLOW_TARGET}); {THREADS} workers",
            ).aiming(FLOW_TARGET, measured, ratio >= 0.90)
        )
        run.add(
            Result.of(
                run.database.name,
                scenario,
                f"{workers.PUMP} without limits{shown}",
                workload.Timing(n, sorted(plain)[len(plain) // 2], []),
                note="TRANSACTION_SCOPE, empty handler, 100 keys",
            )
        )
