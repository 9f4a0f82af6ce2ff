import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqlqueue_orm import headers
from sqlqueue_orm.exceptions import InvalidMessage


def test_slash_is_written_as_dotnet_writes_it():
    text = headers.serialize({"NServiceBus.ReplyToAddress": "a/b", "k": "ü"})
    assert text == '{"NServiceBus.ReplyToAddress":"a\\/b","k":"ü"}'


def test_reads_any_escaping():
    assert headers.deserialize('{"a":"x\\/y","b":"\\u00fc","c":"z/w"}') == {
        "a": "x/y",
        "b": "ü",
        "c": "z/w",
    }


@given(st.dictionaries(st.text(), st.text()))
def test_round_trip(values):
    text = headers.serialize(values)
    assert "/" not in text.replace("\\/", "")
    assert headers.deserialize(text) == values
    assert json.loads(text) == values


def test_non_string_values_are_refused_naming_the_header():
    with pytest.raises(InvalidMessage, match="'n'"):
        headers.serialize({"n": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize("bad", ["[]", '{"a": 1}', '{"a": null}'])
def test_deserialize_rejects_what_is_not_an_object_of_strings(bad):
    with pytest.raises(ValueError):
        headers.deserialize(bad)


def test_time_format():
    moment = dt.datetime(2026, 1, 2, 3, 4, 5, 60708, tzinfo=dt.UTC)
    assert headers.format_time(moment) == "2026-01-02 03:04:05:060708 Z"
    assert headers.parse_time("2026-01-02 03:04:05:060708 Z") == moment
    with pytest.raises(ValueError, match="2026-01-02T03"):
        headers.parse_time("2026-01-02T03:04:05Z")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(60, "00:01:00"), (0.001, "00:00:00.0010000"), (90061.5, "1.01:01:01.5000000")],
)
def test_timespan_format(seconds, text):
    assert headers.format_timespan(seconds) == text
