"""Flow control shared by every process on a queue (docs/scale.md).

The limits are measured by the handlers: each records when it ran, and the test counts how many
of those intervals overlap. Several endpoint processes run at once on PostgreSQL; SQLite's
limits hold within one process, shown with two endpoints of one process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import weakref

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, Transport, connections, exceptions
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode, flow
from sqlqueue_orm.receiving.flow import leases, slots
from sqlqueue_orm.receiving.modes.base import Receiver
from sqlqueue_orm.receiving.worker import WorkerState
from tests.conftest import only
from tests.endpoint_app import Job
from tests.flow_app import FlowBase, most_at_once, spans
from testsupport.outbox_app import REPO


def _processes(url: str, queue: str, count: int, concurrency: int, settings: dict[str, object],
               sleep: float) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.flow_app", url, queue, str(concurrency),
             json.dumps(settings), str(sleep)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(count)
    ]


def _until_spans(engine: sa.Engine, total: int, processes: list[subprocess.Popen[str]],
                 timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    try:
        while len(spans(engine)) < total:
            for process in processes:
                assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, f"{len(spans(engine))} of {total} handled"
            time.sleep(0.1)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


# -- the global concurrency limit ---------------------------------------------------------
@only("postgresql")
def test_global_concurrency_holds_across_processes(database):
    transport = database.transport()
    FlowBase.metadata.create_all(transport.engine)
    transport.create_queue("limited")
    total = 45
    transport.send_many("limited", [OutgoingMessage(Job(number=0)) for _ in range(total)])
    processes = _processes(database.url, "limited", 3, 4, {"global_concurrency": 3}, 0.05)
    _until_spans(transport.engine, total, processes)
    runs = spans(transport.engine)
    assert len({run.message_id for run in runs}) == total
    peak = most_at_once([(run.started, run.ended) for run in runs])
    assert 2 <= peak <= 3  # 3 processes x 4 workers, never more than 3 at once


@only("sqlite")
def test_global_concurrency_holds_across_endpoints_of_one_process_on_sqlite(database):
    transport = database.transport()
    transport.create_queue("limited")
    total = 40
    transport.send_many("limited", [OutgoingMessage(Job(number=0)) for _ in range(total)])
    lock = threading.Lock()
    now = peak = handled = 0

    def handle(job: Job, context: HandlerContext) -> None:
        nonlocal now, peak, handled
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.02)
        with lock:
            now -= 1
            handled += 1

    endpoints = []
    for _ in range(2):
        endpoint = Endpoint("limited", transport, concurrency=4, peek_delay=0.1,
                            transaction_mode=TransactionMode.NONE, global_concurrency=3,
                            delayed_delivery=False)
        endpoint.handle(Job, handle)
        endpoints.append(endpoint)
        endpoint.start()
    try:
        deadline = time.monotonic() + 60
        while handled < total:
            assert time.monotonic() < deadline, handled
            time.sleep(0.02)
    finally:
        for endpoint in endpoints:
            endpoint.stop(10)
    assert 2 <= peak <= 3


@only("postgresql")
def test_global_concurrency_refuses_mode_none_on_a_server(database):
    endpoint = Endpoint("refused", database.transport(), transaction_mode=TransactionMode.NONE,
                        global_concurrency=2)
    endpoint.handle(Job, lambda job, context: None)
    with pytest.raises(exceptions.ConfigurationError, match="cannot run in NONE"):
        endpoint.start()
    endpoint.stop(1)


def test_settings_validate_the_limits():
    with pytest.raises(exceptions.ConfigurationError, match="global_concurrency 0"):
        EndpointSettings(global_concurrency=0)


# -- concurrency per key ------------------------------------------------------------------
def _keyed(transport, queue: str, keys: list[str], per_key: int) -> int:  # type: ignore[no-untyped-def]
    """Send *per_key* jobs of each key, interleaved, numbered in order within their key."""
    transport.create_queue(queue)
    messages = [
        OutgoingMessage(Job(number=number), headers={"customer": key})
        for number in range(per_key)
        for key in keys
    ]
    transport.send_many(queue, messages)
    return len(messages)


def _never_two_of_one_key(runs) -> None:  # type: ignore[no-untyped-def]
    by_key: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        by_key.setdefault(run.key, []).append((run.started, run.ended))
    for key, intervals in by_key.items():
        assert most_at_once(intervals) == 1, key


@only("postgresql")
@pytest.mark.parametrize("batch", [1, 4], ids=["unbatched", "batched"])
def test_one_message_per_key_across_processes_and_a_slow_key_holds_up_no_other(database, batch):
    """Batched, the workers keep their keys' slots from one batch to the next (leases)."""
    transport = database.transport()
    FlowBase.metadata.create_all(transport.engine)
    keys = ["slow", *(f"customer-{n}" for n in range(9))]
    total = _keyed(transport, "keyed", keys, 5)
    total += _keyed(transport, "keyed", ["slow"], 3)  # the slow key has 8 messages
    batching = {"batch_size": batch, "batch_flush": 0.01} if batch > 1 else {}
    processes = _processes(database.url, "keyed", 2, 3,
                           {"key_header": "customer", "key_concurrency": 1, **batching}, 0.05)
    _until_spans(transport.engine, total, processes)
    runs = spans(transport.engine)
    assert len({run.message_id for run in runs}) == total
    _never_two_of_one_key(runs)
    began = min(run.started for run in runs)
    slow_done = max(run.ended for run in runs if run.key == "slow") - began
    others_done = max(run.ended for run in runs if run.key != "slow") - began
    # the slow key's eight runs take 4 s one after the other; the 45 others (2.25 s of
    # handling on 5 other workers) do not wait for it
    print(f"others done after {others_done:.2f} s, the slow key after {slow_done:.2f} s")
    assert others_done < 0.8 * slow_done


@only("postgresql")
def test_strict_fifo_per_key_across_processes(database):
    transport = database.transport()
    FlowBase.metadata.create_all(transport.engine)
    total = _keyed(transport, "ordered", [f"customer-{n}" for n in range(5)], 6)
    processes = _processes(database.url, "ordered", 2, 3,
                           {"key_header": "customer", "key_fifo": True}, 0.02)
    _until_spans(transport.engine, total, processes)
    runs = spans(transport.engine)
    _never_two_of_one_key(runs)
    for key in {run.key for run in runs}:
        assert [run.number for run in runs if run.key == key] == list(range(6)), key


@only("sqlite")
def test_one_message_per_key_within_one_process_on_sqlite(database):
    transport = database.transport()
    keys = ["slow", "a", "b", "c"]
    total = _keyed(transport, "keyed", keys, 4)
    lock = threading.Lock()
    now: dict[str, int] = {}
    peak: dict[str, int] = {}
    done: list[str] = []

    def handle(job: Job, context: HandlerContext) -> None:
        key = context.headers["customer"] or ""
        with lock:
            now[key] = now.get(key, 0) + 1
            peak[key] = max(peak.get(key, 0), now[key])
        time.sleep(0.2 if key == "slow" else 0.01)
        with lock:
            now[key] -= 1
            done.append(key)

    endpoints = []
    for _ in range(2):
        endpoint = Endpoint("keyed", transport, concurrency=3, peek_delay=0.1,
                            transaction_mode=TransactionMode.NONE, key_header="customer",
                            delayed_delivery=False)
        endpoint.handle(Job, handle)
        endpoints.append(endpoint)
        endpoint.start()
    try:
        deadline = time.monotonic() + 60
        while len(done) < total:
            assert time.monotonic() < deadline, done
            time.sleep(0.02)
    finally:
        for endpoint in endpoints:
            endpoint.stop(10)
    assert peak == dict.fromkeys(keys, 1)
    # the slow key's four runs take 0.8 s one after the other; the others pass it
    last_other = max(index for index, key in enumerate(done) if key != "slow")
    assert done[last_other + 1 :].count("slow") >= 2, done


def test_key_settings():
    with pytest.raises(exceptions.ConfigurationError, match="key_fifo needs key_concurrency=1"):
        EndpointSettings(key_header="customer", key_fifo=True, key_concurrency=2)
    with pytest.raises(exceptions.ConfigurationError, match="key_header ''"):
        EndpointSettings(key_header="")


# -- the rate limit -------------------------------------------------------------------------
#: Starts a handler-measured one-second window may hold above rate + burst (wake-up jitter).
JITTER = 2


def _windows_above(starts: list[float], limit: int) -> list[int]:
    """Counts of the one-second windows (one opening at each start) holding over *limit*."""
    ordered = sorted(starts)
    found = []
    for index, start in enumerate(ordered):
        inside = sum(1 for other in ordered[index:] if other < start + 1.0)
        if inside > limit:
            found.append(inside)
    return found


@only("postgresql")
def test_rate_limit_holds_across_processes(database):
    transport = database.transport()
    FlowBase.metadata.create_all(transport.engine)
    transport.create_queue("paced")
    rate, burst, seconds = 50, 5, 10  # the figure: 50/s across 3 processes for 10 s
    total = rate * seconds + burst  # what the limit lets through in 10 s, burst included
    transport.send_many("paced", [OutgoingMessage(Job(number=0)) for _ in range(total + 100)])
    processes = _processes(database.url, "paced", 3, 4,
                           {"rate_limit": rate, "rate_burst": burst}, 0.001)
    _until_spans(transport.engine, total, processes)
    starts = [run.started for run in spans(transport.engine)]
    first = min(starts)
    in_time = [start for start in starts if start < first + seconds]
    # 10 s at 50/s after the first: 500 plus the burst, within 10%
    assert abs(len(in_time) - (rate * seconds + burst)) <= 0.1 * rate * seconds, len(in_time)
    # the schedule starts at most rate + burst per second; a handler's start is measured after
    # its worker wakes from the sleep to its reserved start, which on a loaded machine can put
    # 1 or 2 of them across a window's edge (docs/scale.md)
    assert _windows_above(starts, rate + burst + JITTER) == []


@only("sqlite")
def test_rate_limit_within_one_process_on_sqlite(database):
    transport = database.transport()
    transport.create_queue("paced")
    rate, burst = 50, 5
    transport.send_many("paced", [OutgoingMessage(Job(number=0)) for _ in range(300)])
    starts: list[float] = []
    endpoint = Endpoint("paced", transport, concurrency=2, peek_delay=0.1, rate_limit=rate,
                        rate_burst=burst, transaction_mode=TransactionMode.NONE,
                        delayed_delivery=False)
    endpoint.handle(Job, lambda job, context: starts.append(time.time()))
    endpoint.start()
    time.sleep(2.0)
    endpoint.stop(10)
    assert abs(len(starts) - (2 * rate + burst)) <= 0.1 * 2 * rate, len(starts)
    assert _windows_above(starts, rate + burst + JITTER) == []


def test_rate_settings():
    with pytest.raises(exceptions.ConfigurationError, match="rate_limit 0"):
        EndpointSettings(rate_limit=0)


# -- the cost of the limits far from binding (docs/scale.md "Cost") ----------------------
def _held_elsewhere(engine: sa.Engine, name: str, slots: range) -> sa.Connection:
    """A connection whose open transaction holds *slots* of the lock *name*, as a busy worker."""
    holder = engine.connect()
    holder.begin()
    for slot in slots:
        assert holder.execute(sa.text("SELECT pg_try_advisory_xact_lock(hashtext(:n), :s)"),
                              {"n": name, "s": slot}).scalar()
    return holder


#: The worker each test's receivers run on (as the pump's workers have one each).
_workers: weakref.WeakKeyDictionary[Receiver, WorkerState] = weakref.WeakKeyDictionary()


def _worker_of(receiver: Receiver) -> WorkerState:
    """The worker *receiver* runs on in this test: its number decides the slot tried first."""
    return _workers.setdefault(receiver, WorkerState())


def _fresh(receiver: Receiver) -> WorkerState:
    """*receiver*'s worker at the start of a transaction, as the transaction mode sets it."""
    worker = _worker_of(receiver)
    worker.fresh = True
    return worker


def _limits(transport, queue: str, key_limit: int, global_limit: int):  # type: ignore[no-untyped-def]
    name = transport.address_text(queue)
    gate = flow.GlobalConcurrency(transport, queue, global_limit)
    keys = flow.KeyConcurrency(transport, queue, "customer", key_limit, False, 100, gate)
    _workers[gate] = _worker_of(keys)  # one worker takes both limits' slots
    return name, keys, gate


def _advisory_locks(connection: sa.Connection) -> int:
    return int(connection.execute(sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    )).scalar_one())


@only("postgresql")
def test_a_refused_key_slot_puts_the_row_back_and_the_next_key_is_taken(database, monkeypatch):
    monkeypatch.setattr(slots, "REFUSAL_PAUSE", 60.0)  # the second receive within it, however slow
    transport = database.transport()
    _keyed(transport, "refused", ["busy", "free"], 1)  # the busy key's message is the oldest
    name, keys, _gate = _limits(transport, "refused", 1, 3)
    holder = _held_elsewhere(transport.engine, f"{slots.KEY_PREFIX}{name}\x1fbusy", range(1))
    try:
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            # the plain receive takes the busy key's row, its slot is refused, the transaction
            # is rolled back and the careful scan takes the free key's
            taken = keys.receive(_fresh(keys), connection, 1)
            assert [message.headers["customer"] for message in taken] == ["free"]
            assert _advisory_locks(connection) == 2  # the global slot and the free key's
            transaction.commit()
        statements: list[str] = []

        def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            statements.append(statement)

        _keyed(transport, "refused", ["free"], 1)
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            sa.event.listen(connection, "before_cursor_execute", seen)
            # a refusal was recent: the careful path at once, no receive to roll back
            taken = keys.receive(_fresh(keys), connection, 1)
            sa.event.remove(connection, "before_cursor_execute", seen)
            assert [message.headers["customer"] for message in taken] == ["free"]
            assert not any("RETURNING" in statement and "advisory" in statement
                           for statement in statements), statements
            transaction.commit()
    finally:
        holder.close()
    assert [message.headers["customer"] for message in transport.browse("refused")] == ["busy"]


@only("postgresql")
def test_with_every_global_slot_held_elsewhere_the_keyed_receive_takes_nothing(database):
    transport = database.transport()
    _keyed(transport, "full", ["a", "b"], 2)
    name, keys, _gate = _limits(transport, "full", 1, 2)
    holder = _held_elsewhere(transport.engine, slots.LOCK_PREFIX + name, range(2))
    try:
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            assert keys.receive(_fresh(keys), connection, 1) == []
            transaction.rollback()
    finally:
        holder.close()
    assert len(transport.browse("full")) == 4


@only("postgresql")
def test_a_batch_holds_one_slot_per_key_for_all_its_messages_of_that_key(database):
    """K = 1 and two messages of one key in one batch: both are taken, on one slot.

    A batch handles its messages one after the other, so they are never two at once; the
    slot keeps every other worker off the key until the batch commits.
    """
    transport = database.transport()
    _keyed(transport, "batched", ["one"], 2)
    name, keys, _gate = _limits(transport, "batched", 1, 3)
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        taken = keys.receive(_fresh(keys), connection, 2)
        assert [message.headers["customer"] for message in taken] == ["one", "one"]
        with transport.engine.connect() as other:
            other.begin()
            assert not other.execute(
                sa.text("SELECT pg_try_advisory_xact_lock(hashtext(:n), 0)"),
                {"n": f"{slots.KEY_PREFIX}{name}\x1fone"},
            ).scalar()
        transaction.commit()
    assert transport.browse("batched") == []


@only("postgresql")
def test_rate_starts_reserved_in_blocks_keep_to_the_rate(database):
    transport = database.transport()
    rate, burst = 1_000, 10
    limit = flow.RateLimit(transport.engine, "blocks", rate, 1.0, burst)
    limit.prepare()
    assert limit.block == 20  # 20 ms of the schedule
    reservations = 0

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        nonlocal reservations
        reservations += statement.lstrip().startswith("WITH now")

    sa.event.listen(transport.engine, "before_cursor_execute", count)
    starts: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(60):
            if limit.take(1):
                with lock:
                    starts.append(time.monotonic())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sa.event.remove(transport.engine, "before_cursor_execute", count)
    assert len(starts) == 240
    assert reservations <= 240 // 20 + 4  # one per block, not one per message
    ordered = sorted(starts)
    # any 0.1 s holds at most 100 starts plus the burst plus the block less one, + jitter
    most = max(
        sum(1 for other in ordered[index:] if other < start + 0.1)
        for index, start in enumerate(ordered)
    )
    assert most <= 100 + burst + limit.block - 1 + JITTER, most
    assert ordered[-1] - ordered[0] >= (240 - burst - limit.block) / rate


@only("postgresql")
def test_batches_take_their_starts_from_the_block_and_keep_to_the_rate(database):
    """A batch takes as many starts as the block has left (up to its size), one reservation
    per block, not one per batch; a batch's messages start together at its first start."""
    transport = database.transport()
    rate, burst, batch = 2_000, 10, 10
    limit = flow.RateLimit(transport.engine, "batch-blocks", rate, 1.0, burst)
    limit.prepare()
    assert limit.block == 40  # 20 ms of the schedule
    reservations = 0

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        nonlocal reservations
        reservations += statement.lstrip().startswith("WITH now")

    sa.event.listen(transport.engine, "before_cursor_execute", count)
    starts: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if len(starts) >= 600:
                    return
            granted = limit.take(batch)
            assert 0 <= granted <= batch
            now = time.monotonic()
            with lock:
                starts.extend([now] * granted)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sa.event.remove(transport.engine, "before_cursor_execute", count)
    assert len(starts) >= 600
    # one per block of 40, a few more for blocks dropped part used (BLOCK_LIFE) or cut short
    assert reservations <= len(starts) // limit.block + 8, reservations
    ordered = sorted(starts)
    # any 0.1 s holds at most 200 starts, plus the burst, the block less one and a batch
    # less one (its messages start together), + jitter
    most = max(
        sum(1 for other in ordered[index:] if other < start + 0.1)
        for index, start in enumerate(ordered)
    )
    assert most <= 200 + burst + limit.block - 1 + batch - 1 + JITTER, most
    assert ordered[-1] - ordered[0] >= (len(starts) - burst - limit.block - batch) / rate


@only("postgresql")
def test_a_worker_whose_own_slot_is_held_takes_the_next_free_one(database):
    transport = database.transport()
    _keyed(transport, "preferred", ["k"], 1)
    name, keys, gate = _limits(transport, "preferred", 2, 3)
    own = slots.first_slot(_worker_of(keys), 3)  # its first try, for the global limit (3 slots)
    holder = _held_elsewhere(transport.engine, slots.LOCK_PREFIX + name, range(own, own + 1))
    key_holder = _held_elsewhere(transport.engine, f"{slots.KEY_PREFIX}{name}\x1fk",
                                 range(own % 2, own % 2 + 1))
    try:
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            # the single claim scans on past its own slot
            assert gate.claim(_worker_of(gate), connection)
            assert _advisory_locks(connection) == 1
            transaction.rollback()
            transaction = connection.begin()
            # the one-statement claim too: the key's other slot and another global slot
            taken = keys.receive(_fresh(keys), connection, 1)
            assert [message.headers["customer"] for message in taken] == ["k"]
            assert _advisory_locks(connection) == 2
            transaction.commit()
    finally:
        holder.close()
        key_holder.close()


@only("postgresql")
@pytest.mark.parametrize("count", [1, 30])
def test_a_receive_claims_its_slots_in_the_same_statement(database, count):
    """One statement: the receive, its keys' slots and the global slot (RECEIVE_CLAIMING), for
    one message as for a batch (keys repeated in it hold one lock each)."""
    transport = database.transport()
    sent = [f"k{number % 12}" for number in range(count + 5)]
    _keyed(transport, "folded", sent, 1)
    _name, keys, _gate = _limits(transport, "folded", 1, 3)
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    with transport.engine.connect() as connection:
        transaction = connection.begin()
        sa.event.listen(connection, "before_cursor_execute", seen)
        taken = keys.receive(_fresh(keys), connection, count)
        sa.event.remove(connection, "before_cursor_execute", seen)
        assert [message.headers["customer"] for message in taken] == sent[:count]
        assert len(statements) == 1, statements
        assert statements[0].startswith("DELETE") and "pg_try_advisory_xact_lock" in statements[0]
        # each distinct key's slot and the global one
        assert _advisory_locks(connection) == len(set(sent[:count])) + 1
        transaction.commit()
    assert len(transport.browse("folded", 100)) == 5


@only("postgresql")
def test_the_global_limit_alone_claims_its_slot_in_the_receive(database, monkeypatch):
    """Without a per-key limit the receive takes the global slot in its own statement
    (RECEIVE_GATED); refused, its rows go back and the worker claims first for a while."""
    monkeypatch.setattr(slots, "REFUSAL_PAUSE", 60.0)
    transport = database.transport()
    _keyed(transport, "gated", ["a", "b", "c"], 1)
    name, _keys, gate = _limits(transport, "gated", 1, 2)
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    assert gate.receives
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        sa.event.listen(connection, "before_cursor_execute", seen)
        taken = gate.receive(_fresh(gate), connection, 1)
        sa.event.remove(connection, "before_cursor_execute", seen)
        assert [message.headers["customer"] for message in taken] == ["a"]
        assert len(statements) == 1 and statements[0].startswith("DELETE"), statements
        assert _advisory_locks(connection) == 1
        transaction.commit()
    holder = _held_elsewhere(transport.engine, slots.LOCK_PREFIX + name, range(2))
    try:
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            began = time.monotonic()
            assert gate.receive(_fresh(gate), connection, 2) == []
            assert time.monotonic() - began >= slots.SLOT_WAIT  # it waited for a slot, in vain
            assert _advisory_locks(connection) == 0
            transaction.commit()
        assert not gate.receives  # claims first for REFUSAL_PAUSE seconds
    finally:
        holder.close()
    assert [message.headers["customer"] for message in transport.browse("gated")] == ["b", "c"]


@only("postgresql")
def test_a_refused_global_receive_takes_its_rows_once_a_slot_frees(database, monkeypatch):
    """Refused, the one-statement receive puts its rows back, waits for a slot (freed here
    while it waits), then takes them with the plain receive; once REFUSAL_PAUSE has passed,
    the receive takes its slot in its own statement again."""
    monkeypatch.setattr(slots, "REFUSAL_PAUSE", 0.5)
    transport = database.transport()
    _keyed(transport, "freed", ["a", "b", "c"], 1)
    name, _keys, gate = _limits(transport, "freed", 1, 1)
    holder = _held_elsewhere(transport.engine, slots.LOCK_PREFIX + name, range(1))
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    def ran(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.startswith("SELECT") and not holder.closed:
            holder.close()  # the busy worker commits once the first claim was refused

    try:
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            sa.event.listen(connection, "before_cursor_execute", seen)
            sa.event.listen(connection, "after_cursor_execute", ran)
            taken = gate.receive(_fresh(gate), connection, 2)
            sa.event.remove(connection, "before_cursor_execute", seen)
            sa.event.remove(connection, "after_cursor_execute", ran)
            assert not gate.receives  # refused a moment ago: it claims first for a while
            assert [message.headers["customer"] for message in taken] == ["a", "b"]
            assert _advisory_locks(connection) == 1  # the slot, taken by the claim
            transaction.commit()
    finally:
        holder.close()
    # the one-statement receive; its rows put back (the driver's rollback, no statement); the
    # claim, tried until the slot freed; then the plain receive, without a claim column
    first, *claims, last = statements
    assert first.startswith("DELETE") and "pg_try_advisory_xact_lock" in first, first
    assert last.startswith("DELETE") and "pg_try_advisory_xact_lock" not in last, last
    assert len(claims) == 2, claims  # refused while held, then taken once freed
    assert all(claim.startswith("SELECT") for claim in claims), claims
    deadline = time.monotonic() + 5
    while not gate.receives:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        taken = gate.receive(_fresh(gate), connection, 5)
        assert [message.headers["customer"] for message in taken] == ["c"]
        assert _advisory_locks(connection) == 1
        transaction.commit()
    assert transport.browse("freed") == []


@only("postgresql")
def test_keys_the_one_statement_claim_cannot_read_are_claimed_as_parsed(database):
    """A key written with JSON escapes is read otherwise in SQL: its slot is claimed by name
    as parsed (held elsewhere: refused, the row put back); unreadable headers pass unlimited."""
    from tests.integration.test_unreadable_headers import insert_raw

    transport = database.transport()
    escaped = 'quo"te\\d'
    _keyed(transport, "misread", [escaped, "caf\u00e9", "plain"], 1)
    insert_raw(database, "misread", b"not json at all")
    name, keys, _gate = _limits(transport, "misread", 1, 3)
    holder = _held_elsewhere(transport.engine, f"{slots.KEY_PREFIX}{name}\x1f{escaped}", range(1))
    taken: list[object] = []
    try:
        for _ in range(4):
            with transport.engine.connect() as connection:
                transaction = connection.begin()
                got = keys.receive(_fresh(keys), connection, 1)
                taken.extend(message.headers.get("customer") if message.headers_error is None
                             else "unreadable" for message in got)
                transaction.commit()
    finally:
        holder.close()
    # the escaped key's slot is held: it is skipped, the others (one unreadable) are taken
    assert taken[:3] == ["caf\u00e9", "plain", "unreadable"], taken
    assert [message.headers["customer"] for message in transport.browse("misread")] == [escaped]


@only("postgresql")
def test_the_many_key_claim_scans_past_held_slots_and_refuses_a_full_key(database):
    """The one-statement claim of many keys (a JSON array of names per limit) names the same
    locks as the single claim: keys with quotes, backslashes and other scripts included."""
    transport = database.transport()
    odd = ['quote"d', "back\\slash", "caf\u00e9 \u6771\u4eac", "sep\x1eand\x1fmore"]
    keys_sent = odd + [f"k{number}" for number in range(12)]  # past the scalar form
    _keyed(transport, "grouped", keys_sent, 1)
    name, keys, gate = _limits(transport, "grouped", 2, 3)
    first = slots.first_slot(_worker_of(keys), 3)  # its first try (both limits: modulo theirs)
    own = [_held_elsewhere(transport.engine, f"{slots.KEY_PREFIX}{name}\x1f{key}",
                           range(first % 2, first % 2 + 1)) for key in odd]
    try:
        with transport.engine.connect() as connection:
            transaction = connection.begin()
            # every odd key's own slot is held: the claim by name (a batch's keys read otherwise
            # in its statement; SQL Server's every claim) takes its other one
            claims = [(keys.prefix, keys_sent, 2), ("", [gate.lock_name], 3)]
            assert slots.try_slots(_worker_of(keys), connection, claims)
            assert _advisory_locks(connection) == len(keys_sent) + 1
            transaction.rollback()
            transaction = connection.begin()
            # the receive: keys read in its own statement, the JSON-escaped ones (the quote, the
            # backslash, the control characters) claimed as parsed, besides a lock each for
            # their misread forms (which only restrict)
            taken = keys.receive(_fresh(keys), connection, len(keys_sent))
            assert sorted(message.headers["customer"] for message in taken) == sorted(keys_sent)
            assert _advisory_locks(connection) == len(keys_sent) + 1 + 3
            transaction.rollback()
        # both slots of one odd key held: that key is refused, the rest are taken carefully
        full = _held_elsewhere(transport.engine, f"{slots.KEY_PREFIX}{name}\x1f{odd[1]}",
                               range(1 - first % 2, 2 - first % 2))
        try:
            with transport.engine.connect() as connection:
                transaction = connection.begin()
                taken = keys.receive(_fresh(keys), connection, len(keys_sent))
                assert sorted(message.headers["customer"] for message in taken) == sorted(
                    key for key in keys_sent if key != odd[1])
                transaction.commit()
        finally:
            full.close()
    finally:
        for holder in own:
            holder.close()
    assert [message.headers["customer"] for message in transport.browse("grouped")] == [odd[1]]


@only("postgresql")
def test_a_batch_of_many_keys_takes_each_key_slot_and_the_global_one(database):
    transport = database.transport()
    keys_sent = [f"k{number}" for number in range(12)]  # 13 limits: past the scalar form
    _keyed(transport, "many", keys_sent, 1)
    _name, keys, _gate = _limits(transport, "many", 1, 3)
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        taken = keys.receive(_fresh(keys), connection, 12)
        assert sorted(message.headers["customer"] for message in taken) == sorted(keys_sent)
        assert _advisory_locks(connection) == 13
        transaction.commit()


@only("postgresql")
def test_the_claiming_receives_are_seen_by_instrumentation(database):
    """The one-statement receives (per key, and the global limit's alone) go through the
    transport's instrumentation like a plain receive, with the messages they took."""
    from sqlqueue_orm.instrumentation import NoInstrumentation

    seen: list[list[str | None]] = []

    class Counting(NoInstrumentation):
        def receive(self, queue, proceed):  # type: ignore[no-untyped-def]
            taken = proceed()
            seen.append([message.headers.get("customer") for message in taken])
            return taken

    transport = database.transport(instrumentation=Counting())
    _keyed(transport, "seen", ["a", "b", "c"], 1)
    _name, keys, gate = _limits(transport, "seen", 1, 2)
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        taken = keys.receive(_fresh(keys), connection, 2)
        assert [message.headers["customer"] for message in taken] == ["a", "b"]
        assert _advisory_locks(connection) == 3  # two keys and the global slot
        transaction.commit()
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        assert [m.headers["customer"] for m in gate.receive(_fresh(gate), connection, 5)] == [
            "c"
        ]
        assert gate.receive(_fresh(gate), connection, 5) == []  # nothing left: no claim
        transaction.commit()
    assert seen == [["a", "b"], ["c"], []]


# -- key slots leased from one batch to the next (flow.leases) ------------------------------
def _leasing(transport, queue: str, key_limit: int = 1):  # type: ignore[no-untyped-def]
    name = transport.address_text(queue)
    return name, flow.KeyConcurrency(
        transport, queue, "customer", key_limit, False, 100, batched=True
    )


def _key_free(engine: sa.Engine, name: str, key: str) -> bool:
    """Whether another session can take slot 0 of *key* now (K = 1: the key's only slot)."""
    with engine.connect() as other:
        other.begin()
        return bool(other.execute(sa.text("SELECT pg_try_advisory_xact_lock(hashtext(:n), 0)"),
                                  {"n": f"{slots.KEY_PREFIX}{name}\x1f{key}"}).scalar())


def _batch(transport, keys, queue: str, connection: sa.Connection,  # type: ignore[no-untyped-def]
           count: int = 10) -> tuple[list[str], list[str]]:
    """One batched receive, committed: the keys taken and the statements run."""
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    transaction = connection.begin()
    sa.event.listen(connection, "before_cursor_execute", seen)
    try:
        taken = keys.receive(_fresh(keys), connection, count)
    finally:
        sa.event.remove(connection, "before_cursor_execute", seen)
    transaction.commit()
    return [message.headers["customer"] for message in taken], statements


def _backend_pid(connection: sa.Connection) -> int:
    """The server process of *connection* (read in a transaction of its own, committed)."""
    pid = int(connection.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
    connection.commit()
    return pid


def _session_locks(engine: sa.Engine, pid: int) -> int:
    with engine.connect() as other:
        return int(other.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = :pid"
        ), {"pid": pid}).scalar_one())


@only("postgresql")
def test_a_batched_worker_keeps_its_key_slots_until_a_batch_lacks_the_key(database, caplog):
    """Leases: a key slot stays with the worker's connection past its batch's commit (no other
    session gets it), is not claimed again by the next batch with that key, is given back by
    the first batch without it, and every lease ends when the connection goes back to the
    pool."""
    caplog.set_level("WARNING", logger=connections.__name__)
    transport = database.transport()
    _keyed(transport, "leased", ["a", "b"], 1)
    name, keys = _leasing(transport, "leased")
    with transport.engine.connect() as connection:
        pid = _backend_pid(connection)
        taken, statements = _batch(transport, keys, "leased", connection)
        assert taken == ["a", "b"]
        assert sum("pg_try_advisory_lock" in statement for statement in statements) == 1
        # committed, and still held: the next batch of these keys need not claim them
        assert _session_locks(transport.engine, pid) == 2
        assert not _key_free(transport.engine, name, "a")
        _keyed(transport, "leased", ["b", "a"], 1)
        taken, statements = _batch(transport, keys, "leased", connection)
        assert taken == ["b", "a"]
        assert not any("advisory" in statement for statement in statements), statements
        # a batch of b and c: a is given back, c leased, b kept
        _keyed(transport, "leased", ["b", "c"], 1)
        taken, statements = _batch(transport, keys, "leased", connection)
        assert taken == ["b", "c"]
        assert _key_free(transport.engine, name, "a")
        assert not _key_free(transport.engine, name, "b")
        assert not _key_free(transport.engine, name, "c")
        assert _session_locks(transport.engine, pid) == 2
    # back in the pool: the checkin listener gave the leases back, the connection lives on
    assert _session_locks(transport.engine, pid) == 0
    with transport.engine.connect() as other:
        assert other.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                             {"pid": pid}).scalar_one() == 1
    assert not caplog.records  # given back, not closed for failing to
    assert _key_free(transport.engine, name, "b") and _key_free(transport.engine, name, "c")
    assert transport.browse("leased") == []


@only("postgresql")
def test_giving_leases_back_never_commits_a_transaction_left_open(database):
    """The checkin listener rolls back first: a connection that reaches the pool with a
    receive still open (its reset failed, or it was dropped without being closed) gets its
    rows back in the queue, not deleted by the commit that ends the leases' statement."""
    transport = database.transport()
    _keyed(transport, "left-open", ["a"], 1)
    _name, keys = _leasing(transport, "left-open")
    with transport.engine.connect() as connection:
        pid = _backend_pid(connection)
        assert _batch(transport, keys, "left-open", connection)[0] == ["a"]  # "a" leased
        _keyed(transport, "left-open", ["b"], 1)
        connection.begin()
        assert [m.headers["customer"] for m in transport.receive(
            "left-open", 1, connection=connection)] == ["b"]  # taken, not committed
        fairy = connection.connection
        connections.give_back_session_locks(  # as at checkin
            fairy.dbapi_connection, fairy._connection_record
        )
        assert _session_locks(transport.engine, pid) == 0
        connection.rollback()
    assert [m.headers["customer"] for m in transport.browse("left-open")] == ["b"]


@only("postgresql")
def test_a_refused_lease_puts_the_batch_back_and_gives_every_lease_back(database, monkeypatch):
    monkeypatch.setattr(slots, "REFUSAL_PAUSE", 60.0)
    transport = database.transport()
    _keyed(transport, "contended", ["mine"], 1)
    name, keys = _leasing(transport, "contended")
    with transport.engine.connect() as connection:
        pid = _backend_pid(connection)
        assert _batch(transport, keys, "contended", connection)[0] == ["mine"]
        assert _session_locks(transport.engine, pid) == 1  # "mine" leased
        _keyed(transport, "contended", ["busy", "mine", "free"], 1)
        holder = _held_elsewhere(transport.engine, f"{slots.KEY_PREFIX}{name}\x1fbusy", range(1))
        try:
            # the lease of "busy" is refused: the three rows go back, every lease is given
            # back, and the careful scan takes the two keys it can, by transaction
            taken, _ = _batch(transport, keys, "contended", connection)
            assert taken == ["mine", "free"]
            assert _session_locks(transport.engine, pid) == 0
            assert _key_free(transport.engine, name, "mine")
        finally:
            holder.close()
    assert [message.headers["customer"] for message in transport.browse("contended")] == ["busy"]


@only("postgresql")
def test_a_worker_whose_batches_bring_new_keys_claims_them_per_transaction(database):
    """Leasing only pays while a worker's batches keep bringing the same keys: a batch of
    mostly new keys sends the next ones to the one-statement claim by transaction (leases
    given back), and two batches sharing most of their keys bring leasing back."""
    transport = database.transport()
    name, keys = _leasing(transport, "churning")
    with transport.engine.connect() as connection:
        pid = _backend_pid(connection)

        def batch(sent: list[str]) -> list[str]:
            _keyed(transport, "churning", sent, 1)
            taken, statements = _batch(transport, keys, "churning", connection)
            assert taken == sent
            return statements

        batch(["k0", "k1", "k2", "k3"])  # leased (nothing held before)
        batch(["k4", "k5", "k6", "k7"])  # all new: leased for this batch, then per transaction
        assert _session_locks(transport.engine, pid) == 4
        statements = batch(["k8", "k9", "k10", "k11"])
        assert any("pg_try_advisory_xact_lock" in s and "RETURNING" in s for s in statements)
        assert not any("pg_try_advisory_lock" in s for s in statements)
        assert _session_locks(transport.engine, pid) == 0  # given back; by transaction now
        assert _key_free(transport.engine, name, "k4")
        # three of four keys as the batch before: still by transaction, then leasing again
        statements = batch(["k8", "k9", "k10", "k12"])
        assert any("pg_try_advisory_xact_lock" in s and "RETURNING" in s for s in statements)
        statements = batch(["k8", "k9", "k10", "k12"])
        assert sum("pg_try_advisory_lock" in s for s in statements) == 1
        assert not any("pg_try_advisory_xact_lock" in s for s in statements)
        assert _session_locks(transport.engine, pid) == 4
    assert _session_locks(transport.engine, pid) == 0


def _all_advisory_locks(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        )).scalar_one())


@only("postgresql")
def test_behind_a_transaction_pooler_batches_claim_their_key_slots_per_transaction(
    database, caplog
):
    """Through PgBouncer (transaction pooling) a session is not a server connection: a lease
    could stay on a server connection the worker never sees again. The driver's process id
    (PgBouncer's own) is not the server's, so no lease is taken: the batch claims its keys in
    its transaction, and nothing is left locked on any server connection."""
    from tests.pooler import transaction_pooler

    with transaction_pooler(database.url) as pooled_url:
        pooled = sa.create_engine(pooled_url, connect_args={"prepare_threshold": None})
        try:
            transport = Transport(pooled)
            _keyed(transport, "pooled", ["a", "b"], 1)
            name, keys = _leasing(transport, "pooled")
            with caplog.at_level("INFO", logger=leases.__name__), pooled.connect() as connection:
                taken, statements = _batch(transport, keys, "pooled", connection)
                assert taken == ["a", "b"]
                assert any("RETURNING" in s and "pg_try_advisory_xact_lock" in s
                           for s in statements), statements
                assert not any("pg_try_advisory_lock" in s for s in statements)
                # committed: nothing held, on any server connection
                assert _all_advisory_locks(database.engine) == 0
                assert _key_free(database.engine, name, "a")
            assert any("a pooler?" in record.getMessage() and name in record.getMessage()
                       for record in caplog.records)
        finally:
            pooled.dispose()


@only("postgresql")
def test_a_batched_keyed_pump_behind_a_transaction_pooler_handles_each_message_once(database):
    """The pump end to end through PgBouncer: poll-only wake-up, batches of 10, a per-key
    limit of 1; every message handled once, nothing left locked on any server connection."""
    from tests.pooler import transaction_pooler

    with transaction_pooler(database.url) as pooled_url:
        pooled = sa.create_engine(pooled_url, connect_args={"prepare_threshold": None})
        try:
            transport = Transport(pooled)
            total = _keyed(transport, "pooled-pump", [f"c{n}" for n in range(5)], 8)
            handled: list[int] = []
            endpoint = Endpoint(
                "pooled-pump", transport, wakeup="poll", peek_delay=0.1, concurrency=3,
                batch_size=10, batch_flush=0.01, key_header="customer", key_concurrency=1,
                delayed_delivery=False,
            )

            @endpoint.handle(Job)
            def handle(job: Job, context: HandlerContext) -> None:
                handled.append(job.number)

            endpoint.start()
            try:
                deadline = time.monotonic() + 60
                while endpoint.stats.handled < total and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                endpoint.stop()
            assert endpoint.stats.handled == total, endpoint.stats
            assert sorted(handled) == sorted(n for n in range(8) for _ in range(5))
            assert transport.browse("pooled-pump") == []
            assert _all_advisory_locks(database.engine) == 0
        finally:
            pooled.dispose()


@only("postgresql")
def test_a_worker_whose_session_dies_loses_its_leases_with_it_and_leases_anew(database):
    """The server frees a session's locks when it ends: a worker whose connection died holds
    no key, its next receive fails (nothing taken, nothing handled), and the pool's next
    connection starts with no lease recorded, so it claims its keys again."""
    transport = database.transport()
    _keyed(transport, "dying", ["a"], 1)
    name, keys = _leasing(transport, "dying")
    connection = transport.engine.connect()
    try:
        pid = _backend_pid(connection)
        assert _batch(transport, keys, "dying", connection)[0] == ["a"]
        assert not _key_free(transport.engine, name, "a")
        with transport.engine.connect() as other:
            assert other.execute(sa.text("SELECT pg_terminate_backend(:pid)"),
                                 {"pid": pid}).scalar()
        deadline = time.monotonic() + 10
        while _session_locks(transport.engine, pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _key_free(transport.engine, name, "a")  # the server freed it with the session
        _keyed(transport, "dying", ["a"], 1)
        with pytest.raises(exceptions.DatabaseError, match="terminating connection"):
            _batch(transport, keys, "dying", connection)
    finally:
        connection.close()  # back to the pool: nothing to give back on a dead connection
    with transport.engine.connect() as fresh:  # (the pool recycles every connection it had)
        fresh_pid = _backend_pid(fresh)
        assert fresh_pid != pid
        assert _batch(transport, keys, "dying", fresh)[0] == ["a"]  # not lost, leased anew
        assert _session_locks(transport.engine, fresh_pid) == 1
    assert transport.browse("dying") == []
