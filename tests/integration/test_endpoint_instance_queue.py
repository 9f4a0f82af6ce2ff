"""The instance-specific (callback) queue: ``<endpoint>.<instance>``, pumped beside the input queue.

Two instances of one endpoint share its input queue; each also has a queue of its own, so a
request sent with ``reply_to_this_instance=True`` gets its reply back at the instance that
asked (NServiceBus's uniquely addressable instance, ``When_routing_reply_to_specific_instance``
of NServiceBus.SqlServer's acceptance tests).
"""

from __future__ import annotations

import threading
import time

import pydantic
import pytest

from sqlqueue_orm import OutgoingMessage, exceptions, headers
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode
from tests.conftest import only
from tests.endpoint_app import Job, Meter, send_jobs
from tests.integration.test_endpoint_transaction_modes import run_until

REQUESTS = 5


class Kick(pydantic.BaseModel):
    """Tells an instance to send a request from inside a handler."""

    number: int


class Request(pydantic.BaseModel):
    number: int
    asker: str


class Response(pydantic.BaseModel):
    number: int
    asker: str


def sales(transport, instance: str, replies: list[tuple[str, str, int]]) -> Endpoint:  # type: ignore[no-untyped-def]
    """One instance of the endpoint ``sales``: the same handlers, its own instance name."""
    endpoint = Endpoint("sales", transport, peek_delay=0.1, concurrency=2, instance_name=instance)

    @endpoint.handle(Kick)
    def kick(message: Kick, context: HandlerContext) -> None:
        context.send(
            "billing", Request(number=message.number, asker=instance), reply_to_this_instance=True
        )

    @endpoint.handle(Response)
    def response(message: Response, context: HandlerContext) -> None:
        replies.append((instance, message.asker, message.number))

    return endpoint


def test_each_instance_gets_the_replies_to_its_own_requests(database):
    transport = database.transport()
    replies: list[tuple[str, str, int]] = []
    reply_to: dict[str, set[str | None]] = {"a": set(), "b": set()}
    billing = Endpoint("billing", transport, peek_delay=0.1)

    @billing.handle(Request)
    def request(message: Request, context: HandlerContext) -> None:
        reply_to[message.asker].add(context.headers.get(headers.REPLY_TO_ADDRESS))
        context.reply(Response(number=message.number, asker=message.asker))

    first, second = sales(transport, "a", replies), sales(transport, "b", replies)
    for endpoint in (billing, first, second):
        endpoint.start()
    try:
        assert first.instance_address is not None and second.instance_address is not None
        for number in range(REQUESTS):
            # instance a asks from outside a handler, instance b from inside one (a Kick sent
            # to its own queue, as a .NET endpoint routing to that instance would)
            first.send("billing", Request(number=number, asker="a"), reply_to_this_instance=True)
            transport.send(second.instance_address, OutgoingMessage(Kick(number=number)))
        deadline = time.monotonic() + 30
        while len(replies) < 2 * REQUESTS:
            assert time.monotonic() < deadline, replies
            time.sleep(0.02)
    finally:
        for endpoint in (billing, first, second):
            assert endpoint.stop(10)
    assert sorted(replies) == sorted(
        (instance, instance, number) for instance in "ab" for number in range(REQUESTS)
    )
    assert reply_to == {
        "a": {transport.address_text("sales.a")},
        "b": {transport.address_text("sales.b")},
    }
    # the replies came through the instance queues, none through the shared one
    assert first.stats.handled == second.stats.handled == 0
    assert first.instance_stats.handled == REQUESTS
    assert second.instance_stats.handled == 2 * REQUESTS  # its kicks and its replies
    for queue in ("sales", "sales.a", "sales.b", "billing"):
        assert transport.peek(queue) == 0, queue


def test_the_instance_queue_has_its_own_concurrency_and_failed_queue(database):
    transport = database.transport()
    meter = Meter()
    endpoint = Endpoint(
        "work", transport, peek_delay=0.1, concurrency=1, instance_name="x",
        instance_concurrency=3, transaction_mode=TransactionMode.NONE,
    )

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        with meter:
            time.sleep(0.05)
        if job.fail:
            raise RuntimeError("refused")

    transport.create_queue("work.x")
    send_jobs(transport, "work.x", 12)
    transport.send("work.x", OutgoingMessage(Job(number=99, fail=True)))
    run_until(endpoint, lambda: endpoint.instance_stats.handled + endpoint.instance_stats.failed
              == 13)
    assert meter.peak == 3
    assert endpoint.instance_stats.max_in_flight == 3
    assert endpoint.stats.handled == 0
    [failed] = transport.browse("error")
    assert failed.headers[headers.FAILED_QUEUE] == transport.address_text("work.x")


def test_run_once_drains_the_input_and_the_instance_queue(database):
    transport = database.transport()
    endpoint = Endpoint("jobs", transport, peek_delay=0.1, instance_name="one")
    handled: list[int] = []
    endpoint.handle(Job, lambda job, context: handled.append(job.number))
    for queue in ("jobs", "jobs.one"):
        transport.create_queue(queue)
    send_jobs(transport, "jobs", 20)
    send_jobs(transport, "jobs.one", 20)
    runner = threading.Thread(target=endpoint.run, kwargs={"once": True}, daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive()
    assert sorted(handled) == sorted([*range(20), *range(20)])
    assert transport.peek("jobs") == transport.peek("jobs.one") == 0


@only("sqlite")
def test_reply_to_this_instance_needs_an_instance_name(database):
    endpoint = Endpoint("sales", database.transport())
    with pytest.raises(exceptions.ConfigurationError, match="set instance_name"):
        endpoint.send("billing", b"x", reply_to_this_instance=True)
