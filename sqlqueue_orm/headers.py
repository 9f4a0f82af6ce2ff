r"""The NServiceBus header wire format: a flat JSON object of strings, ``/`` written as ``\\/``.

.NET's DataContractJsonSerializer (transport 3.x to 7.x) writes ``/`` as ``\\/``, and 8.x keeps
doing so for compatibility, so we do too. Non-ASCII characters are written as themselves, as both
.NET serializers do. Reading accepts any valid JSON escaping.

Values may be ``null``: NServiceBus's serializer writes a ``Dictionary<string, string>`` entry
whose value is null as ``null`` (``NServiceBus.ExceptionInfo.HelpLink`` in most error-queue
messages). Such values are read as ``None`` and written back as ``null``.
"""

from __future__ import annotations

import datetime as dt
import json
import reprlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlqueue_orm import exceptions

#: orjson's parser (a dependency), or None where it is not installed: :func:`_parsed`.
_fast_loads: Callable[[str], Any] | None
try:
    import orjson

    _fast_loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the project's dependencies
    _fast_loads = None

MESSAGE_ID = "NServiceBus.MessageId"
CORRELATION_ID = "NServiceBus.CorrelationId"
CONVERSATION_ID = "NServiceBus.ConversationId"
TIME_SENT = "NServiceBus.TimeSent"
CONTENT_TYPE = "NServiceBus.ContentType"
ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
MESSAGE_INTENT = "NServiceBus.MessageIntent"
REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
ORIGINATING_ENDPOINT = "NServiceBus.OriginatingEndpoint"
ORIGINATING_MACHINE = "NServiceBus.OriginatingMachine"
PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
PROCESSING_ENDED = "NServiceBus.ProcessingEnded"
PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
FAILED_QUEUE = "NServiceBus.FailedQ"
TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
EXCEPTION_HELP_LINK = "NServiceBus.ExceptionInfo.HelpLink"
EXCEPTION_INNER_TYPE = "NServiceBus.ExceptionInfo.InnerExceptionType"
EXCEPTION_SOURCE = "NServiceBus.ExceptionInfo.Source"
EXCEPTION_STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
#: Every exception header starts so (``.Data.*`` entries included).
EXCEPTION_INFO_PREFIX = "NServiceBus.ExceptionInfo."
TIME_TO_BE_RECEIVED = "NServiceBus.TimeToBeReceived"
#: When a delayed message is due (wire time), as NServiceBus Core sets it on delayed sends.
DELIVER_AT = "NServiceBus.DeliverAt"

_JSON_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}

#: ``yyyy-MM-dd HH:mm:ss:ffffff Z``, NServiceBus's DateTimeExtensions.ToWireFormattedString.
_WIRE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f Z"


def now_text() -> str:
    """The current UTC time as an NServiceBus wire timestamp (what a send stamps TimeSent with).

    Equal to ``format_time(datetime.now(UTC))`` at a fraction of its cost: the text up to the
    seconds is kept while the second lasts, so only the microseconds are formatted per call.
    """
    second, micro = divmod(time.time_ns() // 1000, 1_000_000)  # ints: no float rounding
    cached = _second_text[0]
    if cached[0] != second:
        moment = time.gmtime(second)
        cached = (
            second,
            f"{moment.tm_year:04d}-{moment.tm_mon:02d}-{moment.tm_mday:02d} "
            f"{moment.tm_hour:02d}:{moment.tm_min:02d}:{moment.tm_sec:02d}",
        )
        _second_text[0] = cached
    return f"{cached[1]}:{micro:06d} Z"


#: [(second since the epoch, its text up to the seconds)]: the tuple is replaced whole, so a
#: thread never pairs one second with another second's text.
_second_text: list[tuple[int, str]] = [(-1, "")]


def format_time(moment: dt.datetime) -> str:
    """Format *moment* (naive means UTC) as an NServiceBus wire timestamp."""
    if moment.tzinfo is not None and moment.utcoffset():
        moment = moment.astimezone(dt.UTC)
    # Formatted by hand: strftime is the slowest part of preparing a send.
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}:{moment.microsecond:06d} Z"
    )


def parse_time(text: str) -> dt.datetime:
    """Parse an NServiceBus wire timestamp into an aware UTC datetime.

    :raises ValueError: naming *text* if it is not in the wire format.
    """
    try:
        parsed = dt.datetime.strptime(text.strip(), _WIRE_TIME_FORMAT)
    except ValueError:
        raise ValueError(f"not an NServiceBus timestamp: {text!r}") from None
    return parsed.replace(tzinfo=dt.UTC)


def format_timespan(seconds: float) -> str:
    """Format a duration as .NET ``TimeSpan.ToString()`` does (``[d.]hh:mm:ss[.fffffff]``)."""
    ticks = round(seconds * 10_000_000)
    days, ticks = divmod(ticks, 864_000_000_000)
    hours, ticks = divmod(ticks, 36_000_000_000)
    minutes, ticks = divmod(ticks, 600_000_000)
    whole, fraction = divmod(ticks, 10_000_000)
    text = f"{hours:02d}:{minutes:02d}:{whole:02d}"
    if days:
        text = f"{days}.{text}"
    if fraction:
        text += f".{fraction:07d}"
    return text


def serialize(headers: Mapping[str, str | None]) -> str:
    """Serialize *headers* to the wire format (``None`` values as ``null``).

    :raises InvalidMessage: naming the header whose key is not a string or whose value is neither
        a string nor ``None``.
    """
    for key, value in headers.items():
        # type() first: a plain str is the usual case and the cheaper test (str subclasses pass
        # through isinstance, as before).
        if (type(key) is not str and not isinstance(key, str)) or (
            type(value) is not str and value is not None and not isinstance(value, str)
        ):
            raise exceptions.InvalidMessage(
                f"header {key!r} has value {value!r}: header keys must be strings and values "
                "strings or None"
            )
    text = _encode_object(headers if type(headers) is dict else dict(headers))
    if not text.isascii():
        _refuse_surrogates(headers)
    # "/" only ever appears inside JSON strings, so a plain replace is exact (RFC 8259 allows \/).
    return text.replace("/", "\\/")


def _refuse_surrogates(headers: Mapping[str, str | None]) -> None:
    """Refuse a header whose key or value holds a lone surrogate (no database can store it).

    :raises InvalidMessage: naming the header.
    """
    for key, value in headers.items():
        for text in (key, value):
            if text is not None and not text.isascii():
                check_text(text, f"header {key!r}")


def check_text(text: str, what: str) -> None:
    """Refuse *text* (*what* names it) when it is not valid Unicode: a lone surrogate.

    Python strings may hold one (from ``surrogateescape``, or a JSON escape of half a pair);
    UTF-8 and UTF-16 cannot encode it, so the database driver would fail on it.

    :raises InvalidMessage: naming *what* and the position of the surrogate.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise exceptions.InvalidMessage(
            f"{what} holds a lone surrogate ({text[error.start]!r} at position {error.start}): "
            "headers and message ids must be valid Unicode text"
        ) from None


def serialize_sent(
    values: Mapping[str, str | None], message_id: str, time_sent: str
) -> str:
    """``serialize({**values, MESSAGE_ID: message_id, TIME_SENT: time_sent})``, faster.

    *values* must hold neither key. The JSON of *values* (checked as :func:`serialize` checks
    it) is cached by their content, so a sender whose headers repeat (endpoint, machine,
    message type, version) formats only the id and the time per message.

    :raises InvalidMessage: as :func:`serialize`.
    """
    try:
        key: Any = tuple(values.items())
        items = _items_cache.get(key)
    except TypeError:  # an unhashable value: serialize() says what is wrong with it
        key, items = None, None
    if not message_id.isascii():
        check_text(message_id, "message id")
    if items is None:
        items = serialize(values)[1:-1]  # checks every key and value
        if key is not None:
            if len(_items_cache) >= _ITEMS_CACHE_SIZE:
                _items_cache.clear()  # a sender with ever-new headers: start over
            _items_cache[key] = items
    sent = (
        f'"{MESSAGE_ID}":{_encode_text(message_id)},"{TIME_SENT}":{_encode_text(time_sent)}'
    ).replace("/", "\\/")
    return f"{{{items},{sent}}}" if items else f"{{{sent}}}"


#: The JSON of header sets already seen (without braces), by their items; equal items give
#: equal JSON (only strings and None are ever stored: anything else fails serialize()).
_items_cache: dict[tuple[tuple[str, str | None], ...], str] = {}
_ITEMS_CACHE_SIZE = 256
#: A JSON string literal, non-ASCII as itself (json's own function for ensure_ascii=False).
_encode_text: Callable[[str], str] = json.encoder.encode_basestring

#: Built once: json.dumps with options builds a new encoder on every call. No circular check:
#: the values are strings or None (checked above).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def _object_encoder() -> Callable[[dict[str, str | None]], str]:
    """``_ENCODER.encode`` for a flat dict of strings and None, minus its per-call set-up.

    ``JSONEncoder.encode`` builds json's C encoder anew on every call, a cost beside the
    encoding itself for a dozen short headers: this builds it once, with the arguments
    ``JSONEncoder.iterencode`` gives it for ``_ENCODER``, so the text is the same byte for byte
    (``test_headers`` compares them on generated header sets). Where json has no C encoder,
    or one that writes otherwise, ``_ENCODER.encode`` itself.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    try:
        chunks = make(
            None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",",
            False, False, True,
        )
        join = "".join
        sample = {"a/b": "\u00fc\n", "c": None}
        if join(chunks(sample, 0)) != _ENCODER.encode(sample):
            return _ENCODER.encode
    except Exception:  # a json whose C encoder takes other arguments: the public way
        return _ENCODER.encode
    return lambda values: join(chunks(values, 0))


_encode_object = _object_encoder()


def deserialize(text: str | bytes) -> dict[str, str | None]:
    """Parse wire-format headers (bytes must be UTF-8).

    :raises ValueError: describing why *text* is not a JSON object of strings and nulls
        (:class:`UnicodeDecodeError` included).
    :raises RecursionError: when *text* nests deeper than the parser can follow. See
        :func:`decode` for a parse that never raises.
    """
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8")
    return _parsed(text)


def _parsed(text: str) -> dict[str, str | None]:
    """*text* parsed and checked: what ``_checked(json.loads(text), text)`` gives, faster.

    orjson parses first; its result is taken only in the one shape headers have, an object
    whose values are all strings or nulls: there it is the very dict ``json.loads`` builds (the
    same strings, the last of duplicate keys in the first one's place), and holds no unpaired
    surrogate (orjson refuses them). Anything else (numbers, which orjson reads otherwise for
    huge integers, an unpaired surrogate, NaN, any error) is parsed again by ``json.loads``,
    so the value, or the error and its message, are exactly the standard parser's.
    """
    if _fast_loads is not None:
        try:
            value = _fast_loads(text)
        except Exception:  # whatever it refuses, json.loads decides (and words the error)
            value = None
        if type(value) is dict:
            for item in value.values():
                if type(item) is not str and item is not None:
                    break
            else:
                return value
    return _checked(json.loads(text), text)


def _checked(value: Any, text: str) -> dict[str, str | None]:
    """*value* (parsed from *text*) if it is an object of strings and nulls; else ValueError."""
    if type(value) is not dict:
        raise ValueError(f"headers are a JSON {_json_type(value)}, not an object")
    for item in value.values():
        if type(item) is not str and item is not None:
            key = next(key for key, found in value.items() if found is item)
            raise ValueError(
                f"header {reprlib.repr(key)} has a JSON {_json_type(item)} value, "
                "not a string or null"
            )
    # Only a \u escape can give an unpaired surrogate. Walk the escapes (text is valid JSON, so
    # each backslash starts one): an escaped backslash before a "u" is not taken for one.
    escape = text.find("\\") if "\\u" in text else -1
    while escape >= 0:
        if text[escape + 1] == "u":
            _refuse_unpaired_surrogates(value)
            break
        escape = text.find("\\", escape + 2)
    return value


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _refuse_unpaired_surrogates(values: Mapping[str, str | None]) -> None:
    """Refuse an escaped surrogate without its pair: no valid text can hold it, nor send it on."""
    for key, item in values.items():
        for part in (key, item):
            if part is not None and not part.isascii():
                try:
                    part.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(
                        f"header {reprlib.repr(key)} holds an unpaired UTF-16 surrogate"
                    ) from None


def decode(
    raw: object, encoding: str = "utf-8"
) -> tuple[dict[str, str | None], str | bytes, str | None]:
    """Parse a queue row's stored headers; never raises, whatever *raw* holds.

    :param raw: the Headers column as the driver returned it: text, or bytes where the receive
        selects it as a blob so that the driver cannot fail decoding it.
    :param encoding: how bytes are encoded (UTF-16LE from SQL Server's nvarchar).
    :returns: ``(headers, raw_headers, error)``: on success the parsed headers, the text as
        stored and ``None``; on failure ``{}``, the content unchanged (text, or bytes when they
        are not valid in *encoding*) and a sentence saying why it could not be read.
    """
    if type(raw) is str:  # PostgreSQL hands out text; SQLite and SQL Server bytes
        text = raw
    else:
        kept = raw if type(raw) is bytes else _keep(raw)
        if raw is None:
            return {}, kept, "headers are NULL"
        try:
            text = kept.decode(encoding) if isinstance(kept, bytes) else kept
        except UnicodeDecodeError as error:
            name = encoding.upper().replace("-LE", "")
            return {}, kept, f"headers are not valid {name}: {error}"
    try:
        return _parsed(text), text, None
    except RecursionError:
        return {}, text, "headers are nested too deeply to parse"
    except Exception as error:  # any reason at all: a row nobody can read must not block its queue
        return {}, text, f"headers cannot be read: {error}"


def _keep(raw: object) -> str | bytes:
    """*raw* as str or bytes (a driver may hand out a memoryview, or None for NULL)."""
    if isinstance(raw, str | bytes):
        return raw
    if isinstance(raw, bytearray | memoryview):
        return bytes(raw)
    return "" if raw is None else str(raw)
