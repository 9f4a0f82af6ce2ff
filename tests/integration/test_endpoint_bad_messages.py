"""An unknown type, an expired message, a poison row: none stops the endpoint or blocks the rest."""

from __future__ import annotations

import time
import uuid

import pydantic
import pytest

from sqlqueue_orm import OutgoingMessage, headers
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.endpoint_app import Job
from tests.integration.test_endpoint_transaction_modes import run_until


class Strict(pydantic.BaseModel):
    """A model the undecodable body does not fit."""

    number: int


@pytest.mark.parametrize(
    "mode", [TransactionMode.TRANSACTION_SCOPE, TransactionMode.NONE], ids=lambda m: m.name
)
def test_bad_messages_neither_stop_the_endpoint_nor_block_the_queue(database, mode):
    transport = database.transport()
    transport.create_queue("inbox")
    poison_id = uuid.uuid4()
    transport.send("inbox", OutgoingMessage(b"?", headers={
        headers.ENCLOSED_MESSAGE_TYPES: "Nobody.Handles.This, Nobody"}, message_id="unknown"))
    transport.send("inbox", OutgoingMessage(Job(number=-1), message_id="expired",
                                            time_to_be_received=0.001))
    with database.engine.begin() as connection:  # headers that are not JSON, as a bad writer left
        transport.queues.table_queue("inbox").send(
            connection, [PreparedMessage(poison_id, "poison", "{not json", b"body", None)]
        )
    transport.send("inbox", OutgoingMessage(b"not json", headers={
        headers.ENCLOSED_MESSAGE_TYPES: "Not.Json.Body"}, message_id="undecodable"))
    good = [transport.send("inbox", OutgoingMessage(Job(number=n))) for n in range(1, 6)]
    time.sleep(0.05)  # the expired one's TTBR passes
    handled: list[str] = []
    # one worker and 5 immediate retries: a blocking message would hold up everything behind it
    settings = EndpointSettings(concurrency=1, transaction_mode=mode, peek_delay=0.1)
    endpoint = Endpoint("inbox", transport, settings=settings)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        handled.append(context.message_id)

    @endpoint.handle(Strict, type_name="Not.Json.Body")
    def never(strict: Strict, context: HandlerContext) -> None:
        raise AssertionError("the body is not valid for the model")

    def done() -> bool:
        stats = endpoint.stats
        return stats.handled + stats.failed + stats.expired + stats.poison == 9

    run_until(endpoint, done)
    assert handled == good
    assert endpoint.stats.expired == 1
    assert endpoint.stats.poison == 1
    assert endpoint.stats.failed == 2
    assert endpoint.stats.retried == 0  # neither failure can pass on a retry
    assert transport.peek("inbox") == 0
    moved = {message.message_id: message for message in transport.receive("error", 10)}
    assert set(moved) == {"unknown", str(poison_id), "undecodable"}
    assert moved[str(poison_id)].raw_headers == "{not json"  # moved as it was stored
    assert moved[str(poison_id)].body == b"body"
    assert moved["unknown"].headers[headers.EXCEPTION_TYPE].endswith("UnknownMessageType")
