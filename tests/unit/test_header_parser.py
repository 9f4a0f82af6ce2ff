"""The headers parser of every receive gives exactly what the standard ``json.loads`` path gives.

``headers.decode`` parses with orjson where it is installed (a dependency) and falls back to
``json.loads`` for anything but an object of strings and nulls. Each case here is decoded twice,
with orjson and with the standard parser alone, and the two results must be identical: the same
dict with its keys in the same order, the same raw text, the same error sentence.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlqueue_orm import headers


def _both(monkeypatch: pytest.MonkeyPatch, raw: object, encoding: str = "utf-8") -> None:
    fast = headers.decode(raw, encoding)
    with monkeypatch.context() as patch:
        patch.setattr(headers, "_fast_loads", None)
        standard = headers.decode(raw, encoding)
    assert list(fast[0].items()) == list(standard[0].items())
    assert type(fast[0]) is dict
    assert fast[1:] == standard[1:]


def test_orjson_parses_where_it_is_installed():
    orjson = pytest.importorskip("orjson")
    assert headers._fast_loads is orjson.loads


_TEXT = st.text() | st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010))
_HEADERS = st.dictionaries(_TEXT, st.none() | _TEXT, max_size=20)


@settings(max_examples=300, deadline=None)
@given(_HEADERS, st.booleans())
def test_any_header_set_parses_alike(values, ascii_only):
    with pytest.MonkeyPatch.context() as monkeypatch:
        text = json.dumps(values, ensure_ascii=ascii_only)
        _both(monkeypatch, text)
        if "\ud800" > max(text, default=""):  # no surrogates: as text in bytes too
            _both(monkeypatch, text.encode("utf-8"))
        try:
            _both(monkeypatch, headers.serialize(values))  # the wire format, \/ escapes
        except ValueError:  # an unpaired surrogate is refused when written
            pass


@pytest.mark.parametrize(
    "raw",
    [
        '{"NServiceBus.MessageId":"a","NServiceBus.ExceptionInfo.HelpLink":null}',
        '{"a":"1","b":"2","a":"3"}',  # the last wins, in the first one's place
        '{"a":"1","b":"2","a":null}',
        '{"Content":"application\\/json","URL":"http:\\/\\/x\\/y"}',
        '{"e":"\\u00e9\\u20ac\\ud83d\\ude00","t":"tab\\tnew\\nline\\"q\\" \\\\ back"}',
        '{"lone":"\\ud800"}',
        '{"low":"\\udc00x"}',
        '{"pair":"\\ud83d\\ude00","escaped":"\\\\ud800"}',
        '{"k\\u0000":"\\u0000"}',
        '{"é€😀":"ü"}',
        '  {"a" : "b" }\n',
        "{}",
        '{"a":NaN}',
        '{"a":Infinity}',
        '{"a":1e400}',
        '{"a":123456789012345678901234567890}',
        '{"a":1.5,"b":"x"}',
        '{"a":true}',
        '{"a":{"b":"c"}}',
        '{"a":["b"]}',
        '["a"]',
        '"a"',
        "null",
        "",
        "\ufeff{}",
        '{"a":"x\ty"}',
        '{"a":"\x01"}',
        "{}x",
        '{"a":"b",}',
        "{'a':'b'}",
        '{"a":"b"} // note',
        "[" * 5000 + "]" * 5000,
        '{"a":' * 3000 + '"b"' + "}" * 3000,
        b'{"a":"\xff"}',
        b'{"a":"\xc3\xa9"}',
        b"\xef\xbb\xbf{}",
        None,
        memoryview(b'{"a":"b"}'),
    ],
)
def test_edge_cases_parse_alike(raw, monkeypatch):
    _both(monkeypatch, raw)


def test_sql_server_utf16_parses_alike(monkeypatch):
    text = '{"NServiceBus.MessageId":"é","HelpLink":null}'
    _both(monkeypatch, text.encode("utf-16-le"), "utf-16-le")
    _both(monkeypatch, b"\x00\xd8", "utf-16-le")


def test_deserialize_parses_alike_and_raises_alike(monkeypatch):
    good = '{"a":"\\/","b":null}'
    assert list(headers.deserialize(good).items()) == [("a", "/"), ("b", None)]
    for bad in ('{"a":1}', '{"a":"\\ud800"}', "[]", "{"):
        with pytest.raises(ValueError) as fast:
            headers.deserialize(bad)
        monkeypatch.setattr(headers, "_fast_loads", None)
        with pytest.raises(ValueError) as standard:
            headers.deserialize(bad)
        monkeypatch.undo()
        assert str(fast.value) == str(standard.value)
