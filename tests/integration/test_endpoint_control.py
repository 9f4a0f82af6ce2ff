"""Live control of a running endpoint: pause, resume and concurrency through the control table.

A pause stops the pump from peeking and receiving while the handler in flight finishes and
commits; what is sent meanwhile waits in the queue and is handled once after the resume (nothing
lost, nothing doubled). A concurrency override grows and shrinks the workers (the handlers
measure how many run at once); clearing it returns to the configured concurrency. A shrink ends
each worker too many after its message, and a grow while they still run starts none beside them
beyond the limit. An endpoint
started while paused starts paused. A database error while reading the control row is logged,
naming the endpoint, and the last state is kept. The library API refuses bad input and logs who
did what.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from sqlqueue_orm import Transport, control, exceptions
from sqlqueue_orm.models.endpoint_control import TABLE_NAME
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.receiving import control as receiving_control
from tests.endpoint_app import Job, Meter, send_jobs


def wait_until(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def applied(endpoint: Endpoint) -> receiving_control.ControlPoller:
    poller = endpoint._control
    assert poller is not None
    return poller


class Recorder:
    """The message ids handled (each handling once: a duplicate would show)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[str] = []

    def add(self, message_id: str) -> None:
        with self.lock:
            self.ids.append(message_id)

    def count(self) -> int:
        with self.lock:
            return len(self.ids)


def test_pause_lets_the_handler_in_flight_finish_and_loses_nothing(database):
    transport = database.transport()
    transport.create_queue("work")
    recorder = Recorder()
    started, release = threading.Event(), threading.Event()
    # SQLite has one writer: a transactional handler in flight would hold the write lock the
    # pause needs (docs/control.md, Limits)
    mode = TransactionMode.TRANSACTION_SCOPE
    if database.dialect == "sqlite":
        mode = TransactionMode.NONE
    endpoint = Endpoint("work", transport, concurrency=2, peek_delay=0.1, transaction_mode=mode)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        if job.number == -1:  # the one in flight while pausing
            started.set()
            assert release.wait(30)
        recorder.add(context.message_id)

    endpoint.start()
    try:
        [slow] = transport.send_many("work", [_job(-1)])
        assert started.wait(20)
        control.pause(transport, "work")
        wait_until(lambda: endpoint._pump is not None and endpoint._pump.paused, "paused")
        release.set()
        wait_until(lambda: recorder.count() == 1, "the handler in flight finished")
        assert endpoint.stats.handled == 1
        peeks = endpoint.stats.peeks
        sent = send_jobs(transport, "work", 20)
        time.sleep(3 * receiving_control.POLL_INTERVAL)  # paused: nothing is taken meanwhile
        assert recorder.count() == 1
        assert endpoint.stats.peeks == peeks  # no peek while paused
        assert endpoint.stats.received == 1  # no receive either
        assert transport.peek("work") == 20
        control.resume(transport, "work")
        wait_until(lambda: recorder.count() == 21, "everything sent while paused is handled")
    finally:
        release.set()
        assert endpoint.stop(10)
    assert collections.Counter(recorder.ids) == collections.Counter([slow, *sent])
    assert transport.peek("work") == 0
    assert [action.action for action in control.log(transport, "work")] == ["resume", "pause"]


def _job(number: int):  # type: ignore[no-untyped-def]
    from sqlqueue_orm import OutgoingMessage

    return OutgoingMessage(Job(number=number))


def _run_and_measure(transport: Transport, endpoint: Endpoint, meter: Meter, count: int) -> int:
    """Send *count* jobs, wait until they are handled; the most handlers that ran at once."""
    meter.peak = 0
    before = endpoint.stats.handled
    send_jobs(transport, "work", count)
    wait_until(lambda: endpoint.stats.handled == before + count, f"{count} more handled")
    return meter.peak


def test_concurrency_grows_shrinks_and_returns_to_the_configured_one(database):
    transport = database.transport()
    transport.create_queue("work")
    meter = Meter()
    settings = EndpointSettings(
        concurrency=1, transaction_mode=TransactionMode.NONE, peek_delay=0.1
    )
    endpoint = Endpoint("work", transport, settings=settings)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        with meter:
            time.sleep(0.05)

    endpoint.start()
    try:
        assert _run_and_measure(transport, endpoint, meter, 6) == 1
        control.set_concurrency(transport, "work", 4)
        wait_until(lambda: applied(endpoint).concurrency == 4, "concurrency 4 applied")
        assert _run_and_measure(transport, endpoint, meter, 40) == 4
        control.set_concurrency(transport, "work", 2)
        wait_until(lambda: applied(endpoint).concurrency == 2, "concurrency 2 applied")
        assert _run_and_measure(transport, endpoint, meter, 24) == 2
        control.set_concurrency(transport, "work", None)
        wait_until(lambda: applied(endpoint).concurrency == 1, "the configured concurrency")
        assert _run_and_measure(transport, endpoint, meter, 6) == 1
        assert endpoint._pump is not None
        wait_until(
            lambda: sum(thread.is_alive() for thread in endpoint._pump._threads) == 1,
            "the retired workers ended",
        )
    finally:
        assert endpoint.stop(10)
    assert transport.peek("work") == 0
    assert [action.action for action in control.log(transport, "work")] == [
        "concurrency default",
        "concurrency 2",
        "concurrency 4",
    ]


class Gates:
    """Handlers that wait, each worker thread on a gate of its own, until the test opens it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        #: The worker thread of each handler started, in order.
        self.starts: list[str] = []
        #: Set: handlers no longer wait.
        self.free = threading.Event()

    def enter(self) -> None:
        name = threading.current_thread().name
        with self.lock:
            self.starts.append(name)
            gate = self.gates.setdefault(name, threading.Event())
        assert self.free.is_set() or gate.wait(30)

    def waiting(self) -> list[str]:
        with self.lock:
            return [name for name, gate in self.gates.items() if not gate.is_set()]

    def started(self) -> list[str]:
        with self.lock:
            return list(self.starts)


@pytest.mark.parametrize(
    "options",
    [
        {"transaction_mode": TransactionMode.NONE},
        {"transaction_mode": TransactionMode.TRANSACTION_SCOPE},
        {"transaction_mode": TransactionMode.TRANSACTION_SCOPE, "batch_size": 2},
    ],
    ids=["NONE", "TRANSACTION_SCOPE", "batched"],
)
def test_a_resize_while_handlers_run_never_lets_more_run_than_the_limit(database, options):
    """Four handlers held: a shrink to 1 and a grow back to 4 start no handler beside them; a
    shrink to 1 again ends three workers as their messages end, with no handler started in
    their place, and the fourth goes on alone."""
    if database.dialect == "sqlite" and options["transaction_mode"] is not TransactionMode.NONE:
        pytest.skip("SQLite has one writer: transactional modes handle one message at a time")
    transport = database.transport()
    transport.create_queue("work")
    meter, gates, recorder = Meter(), Gates(), Recorder()
    endpoint = Endpoint("work", transport, concurrency=4, peek_delay=0.1, **options)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        with meter:
            gates.enter()
        recorder.add(context.message_id)

    sent = send_jobs(transport, "work", 40)
    endpoint.start()
    try:
        wait_until(lambda: len(gates.waiting()) == 4, "four handlers held")
        first = gates.started()
        control.set_concurrency(transport, "work", 1)
        wait_until(lambda: applied(endpoint).concurrency == 1, "concurrency 1 applied")
        control.set_concurrency(transport, "work", None)
        wait_until(lambda: applied(endpoint).concurrency == 4, "concurrency 4 applied")
        time.sleep(3 * receiving_control.POLL_INTERVAL)
        assert (meter.now, gates.started()) == (4, first)  # no worker beside the four

        control.set_concurrency(transport, "work", 1)
        wait_until(lambda: applied(endpoint).concurrency == 1, "concurrency 1 applied")
        *ending, staying = first
        for name in ending:
            gates.gates[name].set()
        worker_threads = [t for t in threading.enumerate() if t.name.startswith("work worker")]
        wait_until(
            lambda: not any(t.is_alive() for t in worker_threads if t.name in ending),
            "the three workers too many ended",
        )
        time.sleep(3 * receiving_control.POLL_INTERVAL)
        assert meter.now == 1
        # each ended after its message (a batched worker: after the rest of its batch), and
        # nobody took their place
        batch = int(options.get("batch_size", 1))
        after = gates.started()[len(first) :]
        assert all(after.count(name) <= batch - 1 for name in ending), after
        assert set(after) <= set(ending)
        assert gates.waiting() == [staying]
        gates.free.set()
        gates.gates[staying].set()
        wait_until(lambda: endpoint.stats.handled == 40, "the rest handled by the one left")
    finally:
        gates.free.set()
        for gate in list(gates.gates.values()):
            gate.set()
        assert endpoint.stop(10)
    assert meter.peak == 4
    assert set(gates.started()[len(first) :]) <= set(first)  # none but the first four ran any
    assert collections.Counter(recorder.ids) == collections.Counter(sent)
    assert transport.peek("work") == 0


def test_an_endpoint_started_while_paused_starts_paused(database):
    transport = database.transport()
    transport.create_queue("work")
    control.set_concurrency(transport, "work", 3)
    control.pause(transport, "work")
    sent = send_jobs(transport, "work", 5)
    recorder = Recorder()
    endpoint = Endpoint("work", transport, concurrency=1, peek_delay=0.1)
    endpoint.handle(Job, lambda job, context: recorder.add(context.message_id))
    endpoint.start()
    try:
        assert endpoint._pump is not None
        assert endpoint._pump.paused  # read before the pump started
        assert endpoint._pump.concurrency == 3
        time.sleep(3 * receiving_control.POLL_INTERVAL)
        assert endpoint.stats.peeks == 0
        assert recorder.count() == 0
        control.resume(transport, "work")
        wait_until(lambda: recorder.count() == 5, "the waiting messages are handled")
    finally:
        assert endpoint.stop(10)
    assert sorted(recorder.ids) == sorted(sent)


def test_a_database_error_while_polling_keeps_the_last_state(database, caplog):
    transport = database.transport()
    transport.create_queue("work")
    control.pause(transport, "work")
    endpoint = Endpoint("work", transport, concurrency=1, peek_delay=0.1)
    recorder = Recorder()
    endpoint.handle(Job, lambda job, context: recorder.add(context.message_id))
    caplog.set_level(logging.WARNING, logger="sqlqueue_orm.receiving.control")
    endpoint.start()
    try:
        poller = applied(endpoint)
        assert poller.paused
        with transport.engine.begin() as connection:  # every read fails from now on
            connection.execute(sa.text(f"DROP TABLE {TABLE_NAME}"))
        wait_until(lambda: poller.failures >= 2, "two failed reads")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # the first failure; the rest at debug
        assert warnings[0].startswith("queue work: cannot read the endpoint's control row")
        assert "keeping paused" in warnings[0]
        sent = send_jobs(transport, "work", 3)
        assert endpoint._pump is not None and endpoint._pump.paused
        assert endpoint._pump.running
        control.pause(transport, "work")  # the table again, still paused
        control.resume(transport, "work")
        wait_until(lambda: recorder.count() == 3, "handled after the resume")
        assert poller.failures == 0
    finally:
        assert endpoint.stop(10)
    assert sorted(recorder.ids) == sorted(sent)


def test_without_the_table_an_endpoint_that_creates_nothing_runs_and_says_so(database, caplog):
    transport = database.transport()
    transport.create_queue("work")
    sent = send_jobs(transport, "work", 3)
    recorder = Recorder()
    endpoint = Endpoint(
        "work",
        transport,
        concurrency=1,
        peek_delay=0.1,
        create_queues=False,
        delayed_delivery=False,
    )
    endpoint.handle(Job, lambda job, context: recorder.add(context.message_id))
    caplog.set_level(logging.INFO, logger="sqlqueue_orm.receiving.control")
    endpoint.start()
    try:
        wait_until(lambda: recorder.count() == 3, "handled")
        time.sleep(2 * receiving_control.POLL_INTERVAL)  # polls that look for no table
    finally:
        assert endpoint.stop(10)
    assert sorted(recorder.ids) == sorted(sent)
    assert not sa.inspect(database.engine).has_table(TABLE_NAME)
    ours = [r for r in caplog.records if r.name == receiving_control.log.name]
    lines = [(r.levelno, r.getMessage()) for r in ours]
    assert lines == [
        (
            logging.INFO,
            "queue work: no table sqlqueue_endpoint_control: live "
            "control (`sqlqueue control`) is off until `sqlqueue migrate` creates it",
        )
    ]


def test_the_api_refuses_bad_input_and_logs_who_did_what(database):
    transport = database.transport()
    transport.create_queue("work")
    for bad in (0, -1, 1001, "4", 2.5, True):
        with pytest.raises(exceptions.ConfigurationError, match=f"concurrency {bad!r} must be"):
            control.set_concurrency(transport, "work", bad)  # type: ignore[arg-type]
    with pytest.raises(exceptions.ConfigurationError, match="unknown endpoint 'nope'"):
        control.resume(transport, "nope")
    with pytest.raises(exceptions.ConfigurationError, match="unknown endpoint 'nope'"):
        control.pause(transport, "nope")
    assert control.state(transport, "work") is None
    with pytest.raises(exceptions.ConfigurationError, match="unknown endpoint 'work'"):
        control.resume(transport, "work")  # never paused
    operator = control.Actor("ops-host", "alice", "10.0.0.7:5123")
    state = control.pause(transport, "work", by=operator)
    assert (state.paused, state.concurrency, state.changed_by) == (
        True,
        None,
        "alice@ops-host from 10.0.0.7:5123",
    )
    state = control.set_concurrency(transport, "work", 7)
    assert (state.paused, state.concurrency) == (True, 7)  # a resize keeps the pause
    state = control.resume(transport, "work")
    assert (state.paused, state.concurrency) == (False, 7)  # a resume keeps the override
    [resumed, resized, paused] = control.log(transport, "work")
    assert (paused.action, paused.host, paused.os_user, paused.client) == (
        "pause",
        "ops-host",
        "alice",
        "10.0.0.7:5123",
    )
    here = control.Actor.here()
    assert (resized.action, resized.host, resized.os_user, resized.client) == (
        "concurrency 7",
        here.host,
        here.os_user,
        None,
    )
    assert resumed.action == "resume"
    assert paused.at <= resized.at <= resumed.at
    assert [s.endpoint for s in control.states(transport)] == ["work"]
