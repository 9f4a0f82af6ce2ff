"""The receive floor (issue 17): receives skip the dead rows an old snapshot keeps, lose nothing.

PostgreSQL receives and peeks scan ``seq >= floor``, the floor trailing the head of the queue
(``sqlqueue_orm/queuing/floor.py``). Rows can appear below it (a send committing late, a
rolled-back receive); these tests prove each is still received, and received once, and that
with a snapshot held a receive does not walk the dead prefix (buffer counts of the statement
the hot path runs, from ``EXPLAIN (ANALYZE, BUFFERS)``, never timings).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.queuing.floor import ReceiveFloor
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.conftest import only
from tests.endpoint_app import Job, send_jobs
from tests.integration.test_endpoint_transaction_modes import run_until


def _bodies(count: int, prefix: str = "m") -> list[OutgoingMessage]:
    return [OutgoingMessage(f"{prefix}{n}".encode()) for n in range(count)]


@only("postgresql")
def test_a_send_committed_late_below_the_floor_is_received_within_the_rescan(database):
    transport = database.transport()
    transport.create_queue("late")
    queue = transport.queues.table_queue("late")
    queue.floor = floor = ReceiveFloor(queue.name, margin=5, rescan=0.5)
    sender = database.engine.connect()
    late_transaction = sender.begin()
    transport.send("late", OutgoingMessage(b"late"), connection=sender)  # the lowest seq
    late_seq = sender.exec_driver_sql(
        f"SELECT max(seq) FROM {queue.quoted_table.replace('%%', '%')}"
    ).scalar_one()
    transport.send_many("late", _bodies(40))  # committed before it, with higher seqs
    received = [m.body for _ in range(20) for m in transport.receive("late")]
    assert len(received) == 20 and b"late" not in received
    assert floor.position > late_seq  # the floor has passed the uncommitted row
    late_transaction.commit()
    sender.close()
    # Messages keep arriving above the floor, so only the rescan can find the late one.
    committed = time.monotonic()
    found_after = None
    number = 39
    while time.monotonic() - committed < floor.rescan + 5.0:
        number += 1
        transport.send("late", OutgoingMessage(f"m{number}".encode()))
        got = [m.body for m in transport.receive("late")]
        received += got
        if b"late" in got:
            found_after = time.monotonic() - committed
            break
    assert found_after is not None, "the late row was never received"
    assert found_after < floor.rescan + 2.0  # the rescan's bound, with slack for a busy machine
    assert number > 45  # found by the rescan, while messages kept arriving above the floor
    while batch := transport.receive("late", 50):
        received += [m.body for m in batch]
    sent = [b"late"] + [f"m{n}".encode() for n in range(number + 1)]
    assert sorted(received) == sorted(sent)  # every message, none twice


@only("postgresql")
def test_a_row_below_the_floor_is_received_at_once_when_nothing_is_above_it(database):
    transport = database.transport()
    transport.create_queue("late")
    queue = transport.queues.table_queue("late")
    queue.floor = floor = ReceiveFloor(queue.name, margin=2, rescan=3600)
    with database.engine.connect() as sender:
        late_transaction = sender.begin()
        transport.send("late", OutgoingMessage(b"late"), connection=sender)
        transport.send_many("late", _bodies(10))
        assert sum(len(transport.receive("late")) for _ in range(10)) == 10
        late_transaction.commit()
    assert floor.position > 1
    assert transport.peek("late") >= 1  # the peek from the floor found nothing, then all
    assert [m.body for m in transport.receive("late")] == [b"late"]
    assert floor.position == 0  # lowered to the row found below it (less the margin)
    assert transport.receive("late") == [] and transport.peek("late") == 0


@only("postgresql")
def test_a_message_rolled_back_below_the_floor_is_retried_at_once(database):
    """Its handler fails after the other workers took the floor past it: retried at once."""
    transport = database.transport()
    transport.create_queue("jobs")
    queue = transport.queues.table_queue("jobs")
    queue.floor = floor = ReceiveFloor(queue.name, margin=5, rescan=3600)  # no rescan
    send_jobs(transport, "jobs", 300)
    attempts: list[int] = []  # handled messages before each attempt of job 0
    handled: list[int] = []
    lock = threading.Lock()
    settings = EndpointSettings(
        concurrency=4, transaction_mode=TransactionMode.TRANSACTION_SCOPE, peek_delay=0.1,
        immediate_retries=3,
    )
    endpoint = Endpoint("jobs", transport, settings=settings)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        if job.number == 0:
            with lock:
                attempts.append(len(handled))
            if len(attempts) == 1:
                deadline = time.monotonic() + 20
                while floor.position <= context.message.row_version + 20:
                    assert time.monotonic() < deadline, floor
                    time.sleep(0.005)
                raise RuntimeError("first attempt fails once the floor has passed it")
        else:
            time.sleep(0.01)  # the others drain slowly: the queue above the floor stays full
        with lock:
            handled.append(job.number)

    run_until(endpoint, lambda: len(handled) == 300)
    assert sorted(handled) == list(range(300))
    assert len(attempts) == 2
    # Retried while most of the queue still waited above the floor (not when it drained, nor
    # at a rescan: there is none within the hour).
    assert attempts[1] < 250, attempts


def _send_late(database: Any, transport: Any, total: int) -> None:
    """*total* messages to "shared" in twenties, the first of each committed after the other
    19 (SQLite, one writer: each twenty in one send)."""
    for start in range(0, total, 20):
        bodies = [OutgoingMessage(f"s{n}".encode()) for n in range(start, start + 20)]
        if database.dialect == "sqlite":  # a send cannot wait open beside the receives
            transport.send_many("shared", bodies)
            continue
        # the first of each 20 takes its seq, then commits after the other 19
        with database.engine.connect() as late:
            transaction = late.begin()
            transport.send("shared", bodies[0], connection=late)
            transport.send_many("shared", bodies[1:])
            time.sleep(0.01)
            transaction.commit()


def _receive_or_roll_back(transport: Any, roll_back: bool) -> list[Any] | None:
    """Up to 3 messages of "shared"; with *roll_back*, any received are returned to the queue
    by a rollback nobody tells the floor about (then None)."""
    with transport.engine.connect() as connection:
        transaction = connection.begin()
        messages = transport.receive("shared", 3, connection=connection)
        if messages and roll_back:
            transaction.rollback()
            return None
        transaction.commit()
    return messages


def test_competing_consumers_with_late_sends_and_rollbacks_receive_each_message_once(database):
    """Threads of two transports (two floors) receive while sends commit out of order and some
    receives roll back without telling anyone (a user's own transaction)."""
    first, second = database.transport(), database.transport()
    first.create_queue("shared")
    for transport in (first, second):
        queue = transport.queues.table_queue("shared")
        if queue.floor is not None:
            queue.floor = ReceiveFloor(queue.name, margin=3, rescan=0.2)
    total = 400
    received: list[bytes] = []
    lock = threading.Lock()
    sending_done = threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            _send_late(database, first, total)
        except BaseException as error:
            errors.append(error)
        finally:
            sending_done.set()

    def consume(transport: Any, worker: int) -> None:
        try:
            count = 0
            idle_since = None
            while True:
                count += 1
                messages = _receive_or_roll_back(transport, count % 7 == worker)
                if messages is None:
                    continue
                if messages:
                    idle_since = None
                    with lock:
                        received.extend(m.body for m in messages)
                    continue
                if sending_done.is_set():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > 0.5:
                        return
                time.sleep(0.002)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=send)] + [
        threading.Thread(target=consume, args=(transport, worker))
        for worker, transport in enumerate([first, first, second, second])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert sorted(received) == sorted(f"s{n}".encode() for n in range(total))
    assert first.peek("shared") == 0


def _buffers(connection: Any, text: str, params: Any) -> int:
    """Shared buffers (hit + read) *text* touches when run, from EXPLAIN (ANALYZE, BUFFERS)."""
    plan = connection.exec_driver_sql(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params
    ).scalar_one()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


@only("postgresql")
def test_with_a_snapshot_held_the_receive_and_peek_do_not_walk_the_dead_rows(database):
    transport = database.transport()
    transport.create_queue("bloat")
    queue = transport.queues.table_queue("bloat")
    queue.floor = ReceiveFloor(queue.name, margin=100, rescan=3600)
    table = queue.quoted_table.replace("%%", "%")
    dead = 20_000
    transport.send_many("bloat", _bodies(dead + 100))
    holder = database.engine.connect().execution_options(isolation_level="REPEATABLE READ")
    try:
        holder.begin()
        holder.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()  # the snapshot
        assert holder.exec_driver_sql("SHOW transaction_isolation").scalar() == "repeatable read"
        taken = 0
        while taken < dead:  # the hot path's own receives: each leaves a dead row behind
            taken += len(transport.receive("bloat", 500))
        assert queue.floor.position >= dead - 1_000
        pages = holder.exec_driver_sql(
            f"SELECT pg_relation_size('{table}') / current_setting('block_size')::int"
        ).scalar_one()
        statement = queue._receive_args(1)[0]
        peek = queue._peek_from_floor
        assert peek is not None
        with database.engine.connect() as connection:
            connection.begin()  # EXPLAIN ANALYZE runs the DELETE: rolled back below
            floored = _buffers(
                connection, statement.text, statement.params({"floor": queue.floor.position})
            )
            whole = _buffers(connection, statement.text, statement.params({"floor": 0}))
            floored_peek = _buffers(
                connection, peek.text, peek.params({"floor": queue.floor.position})
            )
            whole_peek = _buffers(connection, queue._peek.text, queue._peek.params({}))
            connection.rollback()
    finally:
        holder.close()
    # From 0 a receive visits the index entry and the heap tuple of every dead row (the
    # table's pages, each pinned once for its rows); from the floor only the margin's 100.
    assert whole >= pages // 2, (whole, pages)  # the dead rows were really there to walk
    assert whole > 20 * floored, (floored, whole)
    assert whole_peek > 20 * floored_peek, (floored_peek, whole_peek)
    assert len(transport.receive("bloat", 200)) == 100


def test_a_scan_from_0_near_the_head_of_a_new_queue_lowers_nothing(caplog):
    """Rows within the margin of seq 0 (the first of every new queue) put the floor at 0,
    where it is: no lowering (its lock and log line) and no new epoch per receive."""
    floor = ReceiveFloor("new", margin=1_000)
    caplog.set_level(logging.DEBUG, logger="sqlqueue_orm.queuing.floor")
    for lowest in (1, 5, 999):
        position, epoch = floor.start()
        floor.advance(lowest, epoch, position)
        assert floor.start() == (0, epoch)  # a receive under way may still raise the floor
    assert not caplog.records
    floor.advance(1_500, epoch, 0)
    assert floor.position == 500
