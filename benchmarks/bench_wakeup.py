"""Wake-up with the endpoint's default settings, measured from another process (``--only wakeup``).

Every sender here is a process of its own, so the in-process wake-up (a send through the
endpoint's own transport) never helps: what is measured is what a .NET endpoint, a web process
or a cron job sees. The endpoint runs in the benchmark's process; the senders are forked before
it starts (they make their own connections). Latency is the handler's start (``time.time()`` in
the handler) minus the moment the sender's send returned, its commit done (``time.time()`` in
the sender): one machine, one clock.

* **idle** (:data:`IDLE`): an endpoint with default settings; another process sends one message
  at a time, each after a random gap of :data:`GAP` seconds, so the endpoint is idle when each
  arrives. p50, p95, p99, max and the count; target p50 < 5 ms and p99 < 20 ms.
* **sustained** (:data:`SUSTAINED`): another process sends :data:`RATE` msg/s, paced by a
  schedule (a late send goes at once), to an endpoint with default settings; target p95 < 25 ms.
* **four senders** (:data:`SENDERS`): four processes send one message per transaction as fast as
  they can for a fixed time while an endpoint drains a backlog of the queue, filled before the
  round (:data:`BACKLOG_RATE` messages per second of the round, and one second more): under
  load, where a NOTIFY tax would be paid, the endpoint is busy and nobody waits. Without the
  backlog an endpoint that polls wakes up to a peek delay late, handles less within the round
  and leaves the senders more of the machine (on SQLite, more of the one write lock), so the
  cell would weigh the endpoint's share, not the trigger; a round whose backlog ran out is
  counted in the note. The sides: the default wake-up (default settings: whatever trigger they
  install, the endpoint registering whenever idle) and no trigger at all (``notify=False``, the
  trigger removed); where ``notify=True`` still selects the unconditional trigger of older
  releases, that too. The queue is emptied, the trigger removed and the table settled
  (PostgreSQL: ``VACUUM`` and ``CHECKPOINT``; SQLite: a WAL checkpoint) before each round,
  outside the measured time, so each round starts alike. Each side goes first in as many
  rounds as the other (an even count: the round after a purge runs on a slower table, which an
  odd count would charge to one side more often). The
  medians of the rounds; target: default >= 0.97x no trigger.

Variants are chosen only through public settings, so the same cells measure the code before and
after a change of the defaults: before, the defaults poll (latency up to one peek delay).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from benchmarks import bench_endpoint, workload
from benchmarks.workload import Result
from sqlqueue_orm import OutgoingMessage, Transport, addressing, exceptions
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, wakeup

if TYPE_CHECKING:
    from benchmarks.harness import Run

# fork: a sender starts in milliseconds (spawn re-imports SQLAlchemy, seconds on a busy machine).
# Each is forked before the endpoint starts its threads, and makes its own connections.
_FORK = multiprocessing.get_context("fork")

IDLE = "idle send-to-handler, another process"
SUSTAINED_RATE = bench_endpoint.SUSTAINED_RATE
SUSTAINED = f"send-to-handler at {SUSTAINED_RATE} msg/s, another process"
SENDER_COUNT = 4
SENDERS = f"{SENDER_COUNT} sender processes, 1/txn, endpoint draining"
#: The sides: the endpoint's default settings, wake-up off with no trigger, the old trigger.
DEFAULT = "sqlqueue_orm default settings"
NO_TRIGGER = "sqlqueue_orm notify=False, no trigger"
UNCONDITIONAL = "sqlqueue_orm notify=True, unconditional trigger"
#: Seconds between one idle send and the next (uniformly drawn): idle when each arrives.
GAP = (0.02, 0.2)
IDLE_TARGET_P50_MS = bench_endpoint.IDLE_TARGET_P50_MS
IDLE_TARGET_P99_MS = bench_endpoint.IDLE_TARGET_P99_MS
SUSTAINED_TARGET_P95_MS = bench_endpoint.SUSTAINED_TARGET_P95_MS
SENDER_TARGET_RATIO = 0.97
#: The four-sender cell's backlog, per second of a round (plus one): more than an endpoint with
#: an empty handler drains meanwhile, on either database.
BACKLOG_RATE = 20_000
WARM_UP = b"warm-up"
_START_TIMEOUT = 120.0


def _report_failure(out: Any, error: BaseException) -> None:
    out.put(error if isinstance(error, Exception) else RuntimeError(repr(error)))


def timed_sends(
    url: str, queue: str, gaps: list[float], paced: bool, ready: Any, go: Any, out: Any
) -> None:
    """In another process: send one message per gap; put ``({id: commit time}, seconds)``.

    :param gaps: seconds before each send: after the previous send returned, or (*paced*) after
        the previous send was due, so a late send goes at once and the rate is kept.
    """
    try:
        transport = Transport(url)
        transport.send(queue, OutgoingMessage(WARM_UP))  # the connection, the first-use checks
        ready.set()
        if not go.wait(_START_TIMEOUT):
            raise RuntimeError("the endpoint did not start")
        committed: dict[str, float] = {}
        began = due = time.monotonic()
        for gap in gaps:
            due = (due if paced else time.monotonic()) + gap
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            message_id = transport.send(queue, OutgoingMessage(b"timed"))
            committed[message_id] = time.time()
        out.put((committed, time.monotonic() - began))
        transport.close()
    except BaseException as error:
        _report_failure(out, error)
        raise


def latencies(run: Run, gaps: list[float], paced: bool) -> tuple[list[float], float]:
    """(send-to-handler seconds of each message, seconds the sender took) for *gaps*.

    The endpoint has the default settings; the sender (:func:`timed_sends`) is forked first.
    Every message sent must be handled once.
    """
    queue = run.new_queue("wake")
    ready, go, out = _FORK.Event(), _FORK.Event(), _FORK.Queue()
    process = _FORK.Process(
        target=timed_sends, args=(run.database.url, queue, gaps, paced, ready, go, out)
    )
    process.start()
    starts: dict[str, float] = {}
    repeated: list[str] = []
    warm = threading.Event()
    endpoint = Endpoint(queue, run.transport)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        if body == WARM_UP:
            warm.set()
        elif context.message_id in starts:
            repeated.append(context.message_id)
        else:
            starts[context.message_id] = time.time()

    try:
        _wait(ready, out, "the sending process did not start")
        endpoint.start()
        try:
            _wait(warm, out, "the warm-up message was not handled")
            time.sleep(0.2)  # the pump idle again before the first timed send
            go.set()
            result = out.get(timeout=sum(gaps) * 3 + _START_TIMEOUT)
            if isinstance(result, BaseException):
                raise result
            committed, took = result
            deadline = time.monotonic() + 30
            while len(starts) < len(committed) and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            endpoint.stop()
    finally:
        if not go.is_set():
            process.terminate()  # it would wait for a start that is not coming
        process.join(30)
        if process.is_alive():
            process.terminate()
    missing = set(committed) - set(starts)
    if missing or repeated:
        raise AssertionError(
            f"{len(missing)} of {len(committed)} messages not handled, "
            f"{len(repeated)} handled twice"
        )
    return [max(0.0, starts[key] - committed[key]) for key in committed], took


def _wait(event: Any, out: Any, what: str) -> None:
    """Wait for *event*; a failure the sender reported on *out* is raised instead."""
    deadline = time.monotonic() + _START_TIMEOUT
    while not event.wait(0.1):
        if not out.empty():
            reported = out.get()
            raise reported if isinstance(reported, BaseException) else RuntimeError(what)
        if time.monotonic() > deadline:
            raise RuntimeError(what)


def _spread(seconds: list[float]) -> str:
    p50, p95, p99, top = bench_endpoint.percentiles(seconds, 50, 95, 99, 100)
    return f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms, max {top:.1f} ms"


def idle_cell(run: Run) -> None:
    """Idle: one message at a time from another process, random gaps (:data:`GAP`)."""
    samples = run.settings.wakeup_samples
    chance = random.Random(samples)
    gaps = [chance.uniform(*GAP) for _ in range(samples)]
    seconds, took = latencies(run, gaps, paced=False)
    p50, p99 = bench_endpoint.percentiles(seconds, 50, 99)
    run.add(
        Result.of(
            run.database.name,
            IDLE,
            DEFAULT,
            workload.Timing(len(seconds), took, seconds),
            note=f"{len(seconds)} messages from another process, one at a time, "
            f"{GAP[0] * 1000:.0f}-{GAP[1] * 1000:.0f} ms apart; from the send's commit "
            "to the handler's start; rate = what the sender sent",
        ).aiming(
            f"p50 < {IDLE_TARGET_P50_MS:.0f} ms, p99 < {IDLE_TARGET_P99_MS:.0f} ms",
            f"{_spread(seconds)} ({len(seconds)} messages)",
            p50 < IDLE_TARGET_P50_MS and p99 < IDLE_TARGET_P99_MS,
        )
    )


def sustained_cell(run: Run) -> None:
    """Another process sends :data:`SUSTAINED_RATE` msg/s for ``settings.wakeup_seconds``."""
    count = max(1, round(SUSTAINED_RATE * run.settings.wakeup_seconds))
    seconds, took = latencies(run, [1 / SUSTAINED_RATE] * count, paced=True)
    (p95,) = bench_endpoint.percentiles(seconds, 95)
    run.add(
        Result.of(
            run.database.name,
            SUSTAINED,
            DEFAULT,
            workload.Timing(len(seconds), took, seconds),
            note=f"{len(seconds)} messages paced by a schedule; rate = what the sender kept",
        ).aiming(
            f"p95 < {SUSTAINED_TARGET_P95_MS:.0f} ms",
            f"{_spread(seconds)} at {len(seconds) / took:,.0f} msg/s",
            p95 < SUSTAINED_TARGET_P95_MS,
        )
    )


def steady_sender(url: str, queue: str, commands: Any, out: Any) -> None:
    """In another process: per command (seconds), send one message per transaction as fast as
    it can for that long, then put ``(messages, seconds)``; ``None`` ends it."""
    try:
        transport = Transport(url)
        transport.send(queue, OutgoingMessage(WARM_UP))
        out.put((0, 0.0))  # ready
        while (length := commands.get()) is not None:
            sent = 0
            began = time.monotonic()
            end = began + length
            while time.monotonic() < end:
                transport.send(queue, OutgoingMessage(b"x"))  # a new MessageId each
                sent += 1
            out.put((sent, time.monotonic() - began))
        transport.close()
    except BaseException as error:
        _report_failure(out, error)
        raise


def old_trigger_selectable() -> bool:
    """Whether ``notify=True`` still selects the unconditional trigger: it did while wake-up was
    off by default; once the default wakes up, ``notify=True`` asks for the default's trigger."""
    return EndpointSettings().notify is False


def _remove_trigger(transport: Transport, queue: str) -> bool:
    """Drop *queue*'s wake-up trigger; False when the database has no such trigger at all."""
    try:
        wakeup.remove_trigger(transport.engine, addressing.QueueAddress(queue))
    except exceptions.ConfigurationError:
        return False
    return True


def senders_cell(run: Run) -> None:
    """Four sender processes against an endpoint draining, per wake-up variant, alternating."""
    settings = run.settings
    variants: list[tuple[str, dict[str, Any]]] = [(DEFAULT, {}), (NO_TRIGGER, {"notify": False})]
    queue = run.new_queue("senders")
    old_trigger = None
    if not _remove_trigger(run.transport, queue):
        old_trigger = "this database has no NOTIFY trigger"
    elif old_trigger_selectable():
        variants.append((UNCONDITIONAL, {"notify": True}))
    else:
        old_trigger = "notify=True installs the default's trigger now: the old one is gone"
    commands = [_FORK.Queue() for _ in range(SENDER_COUNT)]
    out = _FORK.Queue()
    processes = [
        _FORK.Process(target=steady_sender, args=(run.database.url, queue, each, out))
        for each in commands
    ]
    for process in processes:
        process.start()
    rates: dict[str, list[float]] = {side: [] for side, _ in variants}
    drained: dict[str, list[float]] = {side: [] for side, _ in variants}
    ran_out = {side: 0 for side, _ in variants}
    try:
        _collect(out, SENDER_COUNT, _START_TIMEOUT)
        # not counted: the senders' and the server's first seconds on a new table
        _round(run, queue, {"notify": False}, commands, out, settings.sender_seconds / 2)
        for number in range(settings.sender_rounds + settings.sender_rounds % 2):
            for side, overrides in variants if number % 2 == 0 else variants[::-1]:
                rate, handled, emptied = _round(
                    run, queue, overrides, commands, out, settings.sender_seconds
                )
                rates[side].append(rate)
                drained[side].append(handled)
                ran_out[side] += emptied
                run.log(
                    f"    round {number + 1} {side}: {rate:,.0f} msg/s sent, "
                    f"{handled:,.0f} msg/s handled"
                )
    finally:
        for each in commands:
            each.put(None)
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.terminate()
        run.transport.purge_all(queue)
    medians = {side: statistics.median(values) for side, values in rates.items()}
    base = medians[NO_TRIGGER]
    for side, _ in variants:
        values = rates[side]
        ratio = medians[side] / base
        # each round's ratio compares neighbours in time: steadier than the medians' on a busy
        # machine, printed beside them
        paired = statistics.median(
            mine / other for mine, other in zip(values, rates[NO_TRIGGER], strict=True)
        )
        result = Result(
            run.database.name,
            SENDERS,
            side,
            messages=round(sum(values) * settings.sender_seconds),
            seconds=settings.sender_seconds * len(values),
            rate=medians[side],
            note=f"median of {len(values)} rounds of {settings.sender_seconds:g} s "
            f"({', '.join(f'{v:,.0f}' for v in values)} msg/s), alternating; the endpoint "
            f"handled a median {statistics.median(drained[side]):,.0f} msg/s of the backlog"
            + (f", which ran out in {ran_out[side]} round(s)" if ran_out[side] else ""),
        )
        measured = (
            f"{ratio:.3f}x no trigger ({medians[side]:,.0f} vs {base:,.0f} msg/s, medians "
            f"of {len(values)} rounds; median of the rounds' ratios {paired:.3f}x)"
        )
        if side == DEFAULT:
            result = result.aiming(
                f">= {SENDER_TARGET_RATIO:.2f}x no trigger", measured, ratio >= SENDER_TARGET_RATIO
            )
        elif side == UNCONDITIONAL:
            result = dataclasses.replace(result, measured=measured)
        run.add(result)
    if old_trigger is not None:
        run.skip(SENDERS, UNCONDITIONAL, old_trigger)


def _round(
    run: Run, queue: str, overrides: dict[str, Any], commands: list[Any], out: Any, length: float
) -> tuple[float, float, bool]:
    """One round: an endpoint with *overrides* draining a backlog of *queue* while the senders
    send for *length* seconds; the senders' summed rate, the endpoint's, and whether the
    backlog ran out (the endpoint caught up within the round)."""
    _remove_trigger(run.transport, queue)
    run.fill_backlog(queue, round((length + 1) * BACKLOG_RATE))
    _settle(run, queue)
    endpoint = Endpoint(queue, run.transport, **overrides)
    endpoint.handle_raw(lambda body, context: None)
    endpoint.start()
    try:
        if overrides.get("notify") is False:
            _remove_trigger(run.transport, queue)
        time.sleep(0.2)  # draining the backlog before the senders go
        handled = endpoint.stats.handled
        began = time.monotonic()
        for each in commands:
            each.put(length)
        reports = _collect(out, len(commands), length + _START_TIMEOUT)
        handled = (endpoint.stats.handled - handled) / (time.monotonic() - began)
        emptied = run.transport.peek(queue) == 0
    finally:
        endpoint.stop()
    run.transport.purge_all(queue)
    if emptied:
        run.log("    (the backlog ran out: the endpoint caught up within the round)")
    return sum(sent / seconds for sent, seconds in reports if seconds > 0), handled, emptied


def _settle(run: Run, queue: str) -> None:
    """After a round's purge, before the next: the dead rows vacuumed and a checkpoint taken
    (PostgreSQL), the WAL folded into the database file (SQLite, on a connection of its own:
    the engine's would run it inside its transaction), so no round meets the previous one's
    clean-up at a random moment."""
    engine = run.transport.engine
    if engine.dialect.name != "postgresql":
        checkpointer = sqlite3.connect(str(engine.url.database), isolation_level=None)
        try:
            busy, _, _ = checkpointer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            checkpointer.close()
        if busy:
            run.log("    (the WAL checkpoint before the next round found the database busy)")
        return
    table = run.transport.queues.table_queue(queue).quoted_table.replace("%%", "%")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for statement in (f"VACUUM {table}", "CHECKPOINT"):
            try:
                connection.exec_driver_sql(statement)
            except sa.exc.DBAPIError as error:  # CHECKPOINT needs superuser or pg_checkpoint
                run.log(f"    ({statement} before the next round: {error.orig})")


def _collect(out: Any, count: int, timeout: float) -> list[tuple[int, float]]:
    reports = []
    for _ in range(count):
        report = out.get(timeout=timeout)
        if isinstance(report, BaseException):
            raise report
        reports.append(report)
    return reports


#: The sides the comparison shows beside the wake-up cells: the pump's (the endpoint cells and
#: the batched burn-down), each with the raw loop of its scenario.
_PUMP_SIDE = "sqlqueue_orm Endpoint pump"


def comparison(results: list[Result]) -> list[str]:
    """The wake-up cells beside the pump and batched burn-down cells they must not slow.

    Markdown lines (none when the run has no wake-up cell): one row per cell, so a run before a
    change reads beside one after it. Latency cells show their percentiles, the four senders
    their median rates and ratio, the pump cells their rate and ratio to the raw loop.
    """
    mine = (IDLE, SUSTAINED, SENDERS)
    if not any(r.scenario in mine for r in results):
        return []
    lines = [
        "",
        "Wake-up, beside the cells it must not slow (compare a run before a change "
        "with one after):",
        "",
        "| database | cell | side | figure | target met |",
        "|---|---|---|---|---|",
    ]
    pumps = False
    for r in results:
        if r.skipped:
            if r.scenario in mine:
                lines.append(f"| {r.database} | {r.scenario} | {r.side} | skipped: {r.skipped} | |")
            continue
        met = "" if r.met is None else ("yes" if r.met else "NO")
        if r.scenario in (IDLE, SUSTAINED):
            figure = r.measured
        elif r.scenario == SENDERS:
            figure = r.measured or f"{r.rate:,.0f} msg/s (median of the rounds)"
        elif "send-to-handler" in r.scenario and r.p50_ms is not None:
            figure = f"p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms or 0:.1f} ms"
        elif r.side.startswith(_PUMP_SIDE):
            pumps = True
            raw = next(
                (
                    o
                    for o in results
                    if not o.skipped
                    and o.database == r.database
                    and o.scenario == r.scenario
                    and o.side.startswith("raw ")
                ),
                None,
            )
            ratio = f", {r.rate / raw.rate:.2f}x {raw.side}" if raw and raw.rate else ""
            figure = f"{r.rate:,.0f} msg/s{ratio}"
        else:
            continue
        lines.append(f"| {r.database} | {r.scenario} | {r.side} | {figure} | {met} |")
    if not pumps:
        lines += [
            "",
            "(no pump or batched burn-down cell in this run: "
            "`--only wakeup,pump,batch` puts them beside)",
        ]
    return lines


def wakeup_scenario(run: Run) -> None:
    """The three cells; one that fails is reported and the others still run."""
    cells: list[tuple[str, str, Callable[[Run], None]]] = [
        (IDLE, DEFAULT, idle_cell),
        (SUSTAINED, DEFAULT, sustained_cell),
        (SENDERS, DEFAULT, senders_cell),
    ]
    for scenario, side, cell in cells:
        try:
            cell(run)
        except Exception as error:
            run.skip(scenario, side, f"failed: {type(error).__name__}: {str(error)[:200]}")
            if os.environ.get("SQLQUEUE_BENCH_STRICT"):
                raise
