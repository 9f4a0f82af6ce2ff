import datetime as dt
import json
import re

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


@pytest.mark.parametrize("bad", ["[]", "null", '{"a": 1}', '{"a": {}}', '{"a": [null]}'])
def test_deserialize_rejects_what_is_not_an_object_of_strings_and_nulls(bad):
    with pytest.raises(ValueError):
        headers.deserialize(bad)


# What NServiceBus's DictionarySerializer writes, from the approved outputs of its
# DictionarySerializerTests (Particular/NServiceBus.SqlServer, commit 214c4e8f,
# src/NServiceBus.Transport.SqlServer.UnitTests/ApprovalFiles/DictionarySerializerTests.*).
DOTNET_SERIALIZED = [
    (
        '{"key1":"value1","key2":"value2","keyWithNull":null,"keyWithEmpty":""}',
        {"key1": "value1", "key2": "value2", "keyWithNull": None, "keyWithEmpty": ""},
    ),
    ("{}", {}),
    (
        '{"key\\/with\\/slashes":"value\\/with\\/slashes",'
        '"key\\\\with\\\\backslashes":"value\\\\with\\\\backslashes",'
        '"key\\"with\\"quotes":"value\\"with\\"quotes","key<with>angle":"value<with>angle",'
        '"key&with&ampersand":"value&with&ampersand","key{with}braces":"value{with}braces"}',
        {
            "key/with/slashes": "value/with/slashes",
            "key\\with\\backslashes": "value\\with\\backslashes",
            'key"with"quotes': 'value"with"quotes',
            "key<with>angle": "value<with>angle",
            "key&with&ampersand": "value&with&ampersand",
            "key{with}braces": "value{with}braces",
        },
    ),
    (
        '{"ümlaut":"äöü","emoji":"\\uD83D\\uDE80","japanese":"こんにちは","arabic":"مرحبا",'
        '"newline":"line1\\r\\nline2","tab":"value\\twith\\ttabs"}',
        {
            "ümlaut": "äöü",
            "emoji": "🚀",
            "japanese": "こんにちは",
            "arabic": "مرحبا",
            "newline": "line1\r\nline2",
            "tab": "value\twith\ttabs",
        },
    ),
]


@pytest.mark.parametrize(("text", "expected"), DOTNET_SERIALIZED)
def test_reads_everything_the_dotnet_serializer_writes(text, expected):
    assert headers.deserialize(text) == expected
    assert headers.decode(text) == (expected, text, None)
    assert headers.decode(text.encode("utf-8")) == (expected, text, None)


def test_null_values_are_written_as_dotnet_writes_them():
    values = {"key1": "value1", "key2": "value2", "keyWithNull": None, "keyWithEmpty": ""}
    assert headers.serialize(values) == DOTNET_SERIALIZED[0][0]


@given(st.dictionaries(st.text(), st.none() | st.text()))
def test_round_trip_with_nulls(values):
    assert headers.deserialize(headers.serialize(values)) == values


HOSTILE = [
    ("[" * 100_000, "nested too deeply"),
    ('{"a":' * 100_000, "nested too deeply"),
    (b'{"a":"\xff\xfe"}', "not valid UTF-8"),
    (b"\xc3", "not valid UTF-8"),
    ("", "cannot be read"),
    ("{broken", "cannot be read"),
    ("[1, 2]", "JSON array"),
    ("null", "JSON null"),
    ('"text"', "JSON string"),
    ('{"a": 1}', "JSON number"),
    ('{"a": {"b": "c"}}', "JSON object"),
    ('{"a": NaN}', "JSON number"),
    ('{"a": ' + "1" * 5000 + "}", "cannot be read"),
    ("\ufeff{}", "cannot be read"),
    ('{"a":"\\udc80"}', "unpaired UTF-16 surrogate"),
    ('{"\\ud83d":"b"}', "unpaired UTF-16 surrogate"),
    (None, "NULL"),
]


@pytest.mark.parametrize(("raw", "why"), HOSTILE, ids=lambda value: repr(value)[:20])
def test_decode_never_raises_and_keeps_the_raw_content(raw, why):
    values, kept, error = headers.decode(raw)
    assert values == {}
    assert error is not None and why in error
    assert len(error) < 300  # a sentence, not the hostile content echoed back
    if isinstance(raw, bytes):
        assert kept == raw  # not UTF-8: the bytes, unchanged
    else:
        assert kept == (raw if raw is not None else "")


def test_time_format():
    moment = dt.datetime(2026, 1, 2, 3, 4, 5, 60708, tzinfo=dt.UTC)
    assert headers.format_time(moment) == "2026-01-02 03:04:05:060708 Z"
    assert headers.parse_time("2026-01-02 03:04:05:060708 Z") == moment
    with pytest.raises(ValueError, match="2026-01-02T03"):
        headers.parse_time("2026-01-02T03:04:05Z")


def test_now_text_is_the_wire_format_of_now_across_second_boundaries(monkeypatch):
    """The per-second cache never pairs one second's text with another's microseconds."""
    base = int(dt.datetime(2026, 12, 31, 23, 59, 58, tzinfo=dt.UTC).timestamp()) * 10**9
    steps = [0, 999_999_000, 1_000_000_000, 1_000_001_000, 2_500_000_000, 1_000_000_000]
    for step in steps:  # forwards over two boundaries (a new year), then back (clock set back)
        monkeypatch.setattr(headers.time, "time_ns", lambda step=step: base + step)
        expected = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            microseconds=(base + step) // 1000
        )
        assert headers.now_text() == headers.format_time(expected)
    monkeypatch.undo()
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    text = headers.now_text()
    after = dt.datetime.now(dt.UTC)
    assert before <= headers.parse_time(text) <= after


def test_a_str_subclass_header_is_accepted_and_an_int_refused():
    class Name(str):
        pass

    assert headers.serialize({Name("k"): Name("v")}) == '{"k":"v"}'
    with pytest.raises(InvalidMessage, match="'k'"):
        headers.serialize({"k": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(60, "00:01:00"), (0.001, "00:00:00.0010000"), (90061.5, "1.01:01:01.5000000")],
)
def test_timespan_format(seconds, text):
    assert headers.format_timespan(seconds) == text


def test_decode_reads_sql_server_utf16_bytes():
    # SQL Server's receive hands Headers out as the nvarchar's UTF-16LE bytes.
    text = DOTNET_SERIALIZED[3][0]
    assert headers.decode(text.encode("utf-16-le"), "utf-16-le") == (
        DOTNET_SERIALIZED[3][1],
        text,
        None,
    )
    unpaired = '{"a":"'.encode("utf-16-le") + b"\x00\xd8" + '"}'.encode("utf-16-le")
    values, kept, error = headers.decode(unpaired, "utf-16-le")
    assert values == {} and kept == unpaired
    assert error is not None and error.startswith("headers are not valid UTF-16:")


@given(st.binary() | st.text() | st.recursive(st.none() | st.text(), st.lists))
def test_decode_never_raises_whatever_the_column_holds(raw):
    if isinstance(raw, list):
        raw = json.dumps(raw)
    values, kept, error = headers.decode(raw)
    if error is not None:
        assert values == {}
        assert kept == (raw if raw is not None else "") or kept == raw.decode("utf-8")
    headers.decode(raw, "utf-16-le")


_SENT_KEYS = (headers.MESSAGE_ID, headers.TIME_SENT)


@given(
    st.dictionaries(st.text().filter(lambda key: key not in _SENT_KEYS), st.none() | st.text()),
    st.text(min_size=1),
    st.text(),
)
def test_serialize_sent_equals_serialize_with_the_two_keys_added(values, message_id, sent):
    expected = headers.serialize({**values, headers.MESSAGE_ID: message_id,
                                  headers.TIME_SENT: sent})
    assert headers.serialize_sent(values, message_id, sent) == expected
    assert headers.serialize_sent(values, message_id, sent) == expected  # from the cache


def test_serialize_sent_checks_values_the_cache_has_not_seen():
    values: dict[str, object] = {"k": "v", "a/b": "c/d"}
    first = headers.serialize_sent(values, "id", "now")  # type: ignore[arg-type]
    assert first == (
        '{"k":"v","a\\/b":"c\\/d","NServiceBus.MessageId":"id","NServiceBus.TimeSent":"now"}'
    )
    values["k"] = 1  # the same dict, changed: its items no longer match the cached ones
    with pytest.raises(InvalidMessage, match="'k'"):
        headers.serialize_sent(values, "id", "now")  # type: ignore[arg-type]
    values["k"] = ["unhashable"]
    with pytest.raises(InvalidMessage, match="'k'"):
        headers.serialize_sent(values, "id", "now")  # type: ignore[arg-type]
    assert headers.serialize_sent({}, "i/d", "t") == (
        '{"NServiceBus.MessageId":"i\\/d","NServiceBus.TimeSent":"t"}'
    )


def _reference(values: dict[str, str | None]) -> str:
    """NServiceBus's format as the standard json module writes it: the wire format's definition."""
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")


_WIRE_TEXT = st.text(
    st.characters(codec="utf-8") | st.sampled_from('/\\"\x00\x1f\x7f\u2028\u00a0\u00fc€𝄞'),
    max_size=40,
) | st.text(max_size=5000)


@given(
    st.dictionaries(_WIRE_TEXT.filter(lambda key: key not in _SENT_KEYS), st.none() | _WIRE_TEXT,
                    max_size=30),
    _WIRE_TEXT.filter(str.strip),
)
def test_serialize_writes_the_json_modules_text_byte_for_byte(values, message_id):
    """Unicode, control characters, quotes, backslashes, slashes, nulls, long values."""
    assert headers.serialize(values) == _reference(values)
    now = "2026-05-01 12:00:00:000000 Z"
    sent = headers.serialize_sent(values, message_id, now)
    assert sent == _reference({**values, headers.MESSAGE_ID: message_id, headers.TIME_SENT: now})


def test_serialize_writes_every_control_character_as_json_does():
    values = {chr(code): f"v{chr(code)}" for code in range(0x20)}
    values.update({"a/b": None, "long": "é/" * 10_000, "pair": "\U0001f600"})
    assert headers.serialize(values) == _reference(values)


def test_serialize_refuses_a_lone_surrogate_naming_the_header():
    for values, named in (({"\ud800": "x"}, r"'\ud800'"), ({"a": "x\udfff"}, "'a'")):
        with pytest.raises(InvalidMessage, match=re.escape(f"header {named}")):
            headers.serialize(values)
