"""Stop: when ``stop()`` returns True no worker holds a connection, none receives after it,
and every worker thread ends; a SIGTERM stops ``run()`` whichever thread takes it.

Each test holds a thread at one exact step while the stop begins (a worker in the pump's ticket
queue or its receipt, the loop in its peek, a resize starting a worker, the main thread in its
wait while another takes the signal), as the other stop test does with its slow tickets, so the
window it proves closed is hit on every run, not once in a while.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time

from sqlqueue_orm import exceptions
from sqlqueue_orm.receiving import (
    Endpoint,
    EndpointSettings,
    TransactionMode,
    control,
    pump,
    tasks,
)
from tests.conftest import only
from tests.endpoint_app import Job, send_jobs
from tests.integration.support import wait_until
from tests.integration.test_endpoint_concurrency import _workers_checkouts

TIMEOUT = 30.0


def _worker_threads(queue_name: str) -> list[threading.Thread]:
    return [each for each in threading.enumerate() if each.name.startswith(f"{queue_name} worker")]


def _tell_when_the_stop_begins(monkeypatch, stopping: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """Set *stopping* once a pump's stop has begun (it stopped taking receive tasks)."""
    stop_taking = pump.MessagePump.stop_taking

    def stop_taking_then_tell(self: pump.MessagePump) -> None:
        stop_taking(self)
        stopping.set()

    monkeypatch.setattr(pump.MessagePump, "stop_taking", stop_taking_then_tell)


def test_a_worker_between_two_receives_gives_its_connection_back_before_the_tasks_left(
    database, monkeypatch
):
    """The stop begins while the worker is between two receives, its kept connection held,
    with receive tasks of the last peek still queued. It gives the connection back as it
    passes over the first of them, not after the last: stop() returns True with the
    connection in the pool. (It kept it through all of them, past the stop's deadline, and
    stop() still returned True.)"""
    between = threading.Event()
    stopping = threading.Event()

    class GatedTickets(queue.SimpleQueue):  # type: ignore[type-arg]
        armed = False
        slow = 0.0

        def get(self, block=True, timeout=None):  # type: ignore[no-untyped-def]
            worker = "worker" in threading.current_thread().name
            if worker and not block and GatedTickets.armed and self.qsize() >= 2:
                GatedTickets.armed = False
                between.set()  # after a receive, holding its connection, tasks still queued
                stopping.wait(10)
                GatedTickets.slow = 0.05  # each task passed over now costs this long
            elif worker and not block and GatedTickets.slow:
                time.sleep(GatedTickets.slow)
            return super().get(block, timeout)

    tickets = type("Tickets", (), {"SimpleQueue": GatedTickets, "Empty": queue.Empty})
    monkeypatch.setattr(pump, "queue_module", tickets)
    _tell_when_the_stop_begins(monkeypatch, stopping)
    transport = database.transport()
    transport.create_queue("between")
    send_jobs(transport, "between", 300)
    _checkouts, held = _workers_checkouts(transport.engine)
    settings = EndpointSettings(concurrency=1, peek_delay=0.1, delayed_delivery=False,
                                transaction_mode=TransactionMode.TRANSACTION_SCOPE)
    endpoint = Endpoint("between", transport, settings=settings)
    endpoint.handle(Job)(lambda job, context: None)
    endpoint.start()
    try:
        wait_until(lambda: endpoint.stats.handled >= 20, "handled 20", TIMEOUT)
        GatedTickets.armed = True
        assert between.wait(30)
    finally:
        stopped = endpoint.stop(2)  # the tasks left take far longer to pass over, held
        still = dict(held)
        GatedTickets.slow = 0.0  # the rest passed over at once
    assert stopped
    assert not still, still


def test_a_worker_that_took_a_task_as_the_stop_began_does_not_receive_after_it(
    database, monkeypatch
):
    """An idle worker (no connection) takes a receive task just before the stop begins and is
    held between the task and the receive while stop() runs. stop() returns True at once (no
    receive running, no connection held): the worker must then not receive. (It checked the
    stop before and counted itself after, so it received and handled the message after stop()
    had returned.)"""
    taken = threading.Event()
    returned = threading.Event()

    class HeldReceipt(tasks.Receipt):
        armed = False

        def __init__(self, *args: object) -> None:
            if HeldReceipt.armed:
                HeldReceipt.armed = False
                taken.set()
                returned.wait(10)
            super().__init__(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(tasks, "Receipt", HeldReceipt)
    transport = database.transport()
    transport.create_queue("taking")
    checkouts, held = _workers_checkouts(transport.engine)
    handled: list[int] = []
    settings = EndpointSettings(concurrency=1, peek_delay=0.1, delayed_delivery=False,
                                transaction_mode=TransactionMode.TRANSACTION_SCOPE)
    endpoint = Endpoint("taking", transport, settings=settings)
    endpoint.handle(Job)(lambda job, context: handled.append(job.number))
    endpoint.start()
    try:
        # the receive that confirmed the queue empty, then idle: its connection given back
        wait_until(lambda: checkouts and not held, "idle, holding no connection", TIMEOUT)
        HeldReceipt.armed = True
        send_jobs(transport, "taking", 1)
        assert taken.wait(30)
        made = len(checkouts)
    finally:
        stopped = endpoint.stop(5)
        returned.set()
    for thread in _worker_threads("taking"):
        thread.join(10)
        assert not thread.is_alive()
    assert stopped
    assert len(checkouts) == made and handled == [], (len(checkouts), made, handled)
    assert transport.peek("taking") == 1  # the message waits for the next start



def test_a_resize_as_the_stop_begins_leaves_no_worker_behind(database, monkeypatch):
    """A concurrency resize (the control poller's) starts a worker while the stop begins and
    the loop ends (here its peek failed): every worker thread ends. (The loop's last step
    counted the workers without the lock the resize holds, so it missed the new one, which
    then waited for a task forever.)"""
    name = f"resized_{database.dialect}"  # a worker one run left behind is not the next's
    peeking, resizing, stopping = threading.Event(), threading.Event(), threading.Event()

    class GatedThread(threading.Thread):
        def start(self) -> None:
            super().start()
            if self.name.startswith(f"{name} worker +"):
                resizing.set()
                for loop in [t for t in threading.enumerate() if t.name == f"{name} pump"]:
                    loop.join(1.0)  # the loop ends meanwhile, or waits for the resize

    monkeypatch.setattr(pump.threading, "Thread", GatedThread)
    _tell_when_the_stop_begins(monkeypatch, stopping)
    transport = database.transport()
    transport.create_queue(name)
    peek = transport.peek

    def gated_peek(*args: object, **kwargs: object) -> int:
        if threading.current_thread().name == f"{name} pump" and not peeking.is_set():
            peeking.set()
            assert resizing.wait(10) and stopping.wait(10)
            raise exceptions.DatabaseError("the peek failed as the stop began")
        return peek(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(transport, "peek", gated_peek)
    settings = EndpointSettings(concurrency=2, peek_delay=0.1, delayed_delivery=False,
                                transaction_mode=TransactionMode.TRANSACTION_SCOPE)
    endpoint = Endpoint(name, transport, settings=settings)
    endpoint.handle(Job)(lambda job, context: None)
    endpoint.start()
    assert endpoint._pump is not None
    resize = threading.Thread(target=endpoint._pump.resize, args=(3,))
    workers: list[threading.Thread] = []
    try:
        assert peeking.wait(30)
        resize.start()
        assert resizing.wait(30)
        workers = _worker_threads(name)
    finally:
        stopped = endpoint.stop(5)
    resize.join(10)
    for thread in workers:
        thread.join(5)
    assert stopped
    assert len(workers) == 3 and not [each for each in workers if each.is_alive()], workers


def test_a_stop_during_start_up_waits_for_it_and_ends_every_thread_it_started(
    database, monkeypatch
):
    """A stop (a SIGTERM's, on a thread of its own) that begins once the pumps have started,
    before the start has started the control poller, the delayed mover and the health writer,
    waits for the start, then stops them too: it returns True and no thread of the endpoint is
    left. (It ran beside the start: it found those parts not there yet and left them running
    once started, or failed joining the control poller's thread not yet started, and the
    process never ended.)"""
    name = f"starting_{database.dialect}"
    stopping = threading.Event()
    _tell_when_the_stop_begins(monkeypatch, stopping)
    transport = database.transport()
    transport.create_queue(name)
    endpoint = Endpoint(name, transport, settings=EndpointSettings(
        concurrency=2, peek_delay=0.1, heartbeat_interval=0.2))
    endpoint.handle(Job)(lambda job, context: None)
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(endpoint.stop(5)), name="stopper")
    poller_start = control.ControlPoller.start

    def stop_then_start(self: control.ControlPoller) -> None:
        stopper.start()  # the pumps run; the rest of the start-up is still to come
        stopping.wait(2.0)  # the stop begins now, or waits for the start
        poller_start(self)

    monkeypatch.setattr(control.ControlPoller, "start", stop_then_start)
    endpoint.start()
    stopper.join(TIMEOUT)
    assert stopped == [True]

    def left() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(f"{name} ")]

    wait_until(lambda: not left(), "the endpoint's threads to end", 10)


@only("sqlite")  # signals, not the database: one dialect proves it
def test_a_sigterm_another_thread_takes_stops_run(database):
    """``run()``: a SIGTERM the kernel hands to a thread other than the main one (any thread of
    a process may take its signal) stops the endpoint. (Python runs a signal's handler in the
    main thread only, and that thread waited for the stop without a timeout, so it never ran
    it: the process went on as if it had not been signalled.)"""
    assert threading.current_thread() is threading.main_thread()  # run() installs handlers
    transport = database.transport()
    transport.create_queue("signalled")
    endpoint = Endpoint("signalled", transport, settings=EndpointSettings(peek_delay=0.1))
    endpoint.handle(Job)(lambda job, context: None)
    returned = threading.Event()
    rescued: list[bool] = []

    main = threading.main_thread().ident

    def main_waits_for_the_stop() -> bool:
        frame = sys._current_frames().get(main)  # type: ignore[arg-type]
        names = []
        while frame is not None:
            names.append(frame.f_code.co_qualname)
            frame = frame.f_back
        return "Endpoint.wait" in names

    def signal_this_thread() -> None:
        wait_until(main_waits_for_the_stop, "run() waiting for the stop", TIMEOUT)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # this thread, not main
        if not returned.wait(10):
            rescued.append(True)  # the signal did nothing: stop it, or run() never returns
            endpoint.stop(5)

    signaller = threading.Thread(target=signal_this_thread, name="signaller")
    signaller.start()
    try:
        endpoint.run()
    finally:
        returned.set()
        signaller.join(30)
    assert not rescued
