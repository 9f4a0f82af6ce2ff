import dataclasses
import datetime as dt
import math
import uuid

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqlqueue_orm import IncomingMessage, OutgoingMessage, headers
from sqlqueue_orm.exceptions import InvalidMessage
from sqlqueue_orm.messages import PreparedMessage


class OrderPlaced(pydantic.BaseModel):
    order_id: int
    customer: str


def test_every_send_gets_message_id_and_time_sent():
    prepared = OutgoingMessage(b"x").prepare(now=dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC))
    values = headers.deserialize(prepared.headers)
    assert uuid.UUID(values[headers.MESSAGE_ID])
    assert values[headers.TIME_SENT] == "2026-05-01 12:00:00:000000 Z"
    assert prepared.message_id == values[headers.MESSAGE_ID]


def test_given_message_id_wins():
    prepared = OutgoingMessage(b"x", message_id="abc").prepare()
    assert headers.deserialize(prepared.headers)[headers.MESSAGE_ID] == "abc"


def test_pydantic_body_sets_content_type_and_enclosed_types():
    prepared = OutgoingMessage(OrderPlaced(order_id=7, customer="ü")).prepare()
    values = headers.deserialize(prepared.headers)
    assert values[headers.CONTENT_TYPE] == "application/json"
    assert values[headers.ENCLOSED_MESSAGE_TYPES].endswith("test_messages.OrderPlaced")
    assert OrderPlaced.model_validate_json(prepared.body or b"") == OrderPlaced(
        order_id=7, customer="ü"
    )


@pytest.mark.parametrize("ttbr", [0, -1, math.inf, math.nan, "10", True])
def test_bad_ttbr_is_refused_naming_it(ttbr):
    with pytest.raises(InvalidMessage) as info:
        OutgoingMessage(b"x", time_to_be_received=ttbr).prepare()
    assert repr(ttbr) in str(info.value)


def test_ttbr_in_ms():
    assert OutgoingMessage(b"x", time_to_be_received=dt.timedelta(days=30)).prepare().ttbr_ms == (
        30 * 86_400_000
    )


def test_bad_body_is_refused_naming_its_type():
    with pytest.raises(InvalidMessage, match="dict"):
        OutgoingMessage({"a": 1}).prepare()  # type: ignore[arg-type]


def test_poison_headers_are_kept_raw():
    message = IncomingMessage.from_row(uuid.uuid4(), 1, "{not json", b"b", False)
    assert message.headers == {}
    assert message.headers_error
    assert message.raw_headers == "{not json"


_NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("given", "ttbr", "body"),
    [
        ({}, None, b"x"),  # the cached form: MessageId and TimeSent after the caller's headers
        ({"a": "1", "b": None}, None, "text"),
        ({"a": "1", headers.TIME_TO_BE_RECEIVED: "00:01:00"}, 60, b"x"),
        ({"a": "1"}, 60, b"x"),  # TTBR header added: the ordinary form
        ({headers.MESSAGE_ID: "theirs", "a": "1"}, None, b"x"),  # replaced in its place
        ({"a": "1", headers.TIME_SENT: None}, None, b"x"),  # a caller's null is kept
        ({"a": "1"}, None, OrderPlaced(order_id=1, customer="c")),
    ],
)
def test_prepared_headers_are_the_wire_format_of_what_prepare_adds(given, ttbr, body):
    """Whichever way prepare writes them, the text is serialize() of the headers in order."""
    message = OutgoingMessage(body, headers=given, time_to_be_received=ttbr, message_id="m-1")
    for _ in range(2):  # the second time from the cache, where it applies
        prepared = message.prepare(now=_NOW)
        values = headers.deserialize(prepared.headers)
        assert headers.serialize(values) == prepared.headers
        assert list(values)[: len(given)] == list(given)
        assert values[headers.MESSAGE_ID] == "m-1"  # message_id= wins over the header
        expected_sent = given[headers.TIME_SENT] if headers.TIME_SENT in given else (
            "2026-05-01 12:00:00:000000 Z"
        )
        assert values[headers.TIME_SENT] == expected_sent


def test_from_row_builds_what_the_constructor_builds():
    """from_row sets the fields directly: every field, the same values, still frozen."""
    native = uuid.uuid4()
    built = IncomingMessage.from_row(native, 7, '{"a":"b"}', b"body", True, "q")
    assert built == IncomingMessage(native, 7, {"a": "b"}, b"body", True, '{"a":"b"}', None, "q")
    assert vars(built).keys() == {field.name for field in dataclasses.fields(IncomingMessage)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.body = b"other"  # type: ignore[misc]
    assert hash(built.id) == hash(native) and "row_version=7" in repr(built)


_SENT_KEYS = (headers.MESSAGE_ID, headers.TIME_SENT)
_HEADER_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from('/\\"\x00\u2028'))


@given(
    st.dictionaries(_HEADER_TEXT.filter(lambda key: key not in _SENT_KEYS),
                    st.none() | _HEADER_TEXT, max_size=12),
    _HEADER_TEXT.filter(bool),
    st.none() | st.binary(max_size=64),
    st.datetimes(timezones=st.just(dt.UTC)),
)
def test_the_usual_send_prepares_what_the_general_way_prepares(given_headers, message_id, body,
                                                               now):
    """The one-step prepare of a usual send: the same row, field for field, or the same refusal."""
    message = OutgoingMessage(body, headers=given_headers, message_id=message_id)
    if not message_id.strip():
        with pytest.raises(InvalidMessage):
            message.prepare(now=now)
        with pytest.raises(InvalidMessage):
            message._prepare(now)
        return
    prepared = message.prepare(now=now)
    assert prepared == message._prepare(now)
    assert prepared.headers == headers.serialize(
        {**given_headers, headers.MESSAGE_ID: message_id,
         headers.TIME_SENT: headers.format_time(now)}
    )
    assert vars(prepared).keys() == {field.name for field in dataclasses.fields(PreparedMessage)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.body = b"other"  # type: ignore[misc]


@pytest.mark.parametrize("message_id", [None, ""])
def test_the_usual_send_without_a_message_id_gets_a_new_one_each_time(message_id):
    message = OutgoingMessage(b"x", headers={"a": "b"}, message_id=message_id)
    first, second = message.prepare(), message.prepare()
    assert uuid.UUID(first.message_id) and first.message_id != second.message_id
    assert first.id == second.id == message.id
    assert headers.deserialize(first.headers)[headers.MESSAGE_ID] == first.message_id
