"""Queue sub-commands: create-queue, send, receive, browse, peek, purge, list-queues.

``receive`` writes each message inside the transaction that takes it off the queue and commits
only once the output is flushed (and, on a pipe, read): if standard output closes first
(``sqlqueue receive --count 5 | head -1``), the transaction rolls back and the messages stay.
Bodies are written losslessly: ``body`` as text when it is valid UTF-8, else ``body_base64``.
``browse`` without ``--json`` shows the start of a long body, with a marker giving its length
(``--full-body`` shows it all); plain lines escape control characters
(:func:`sqlqueue_orm.cli.listings.printable`).
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import logging
import os
import select
import stat
import struct
import sys
import termios
import time
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import arguments, failures, listings
from sqlqueue_orm.cli.context import CommandContext
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage

if TYPE_CHECKING:
    import sqlalchemy as sa

log = logging.getLogger(__name__)

#: Seconds a live reader of a pipe may read nothing before receive stops waiting for it.
PATIENCE = 5.0


def _context(args: argparse.Namespace) -> CommandContext:
    context: CommandContext = args.context
    return context


# -- output -------------------------------------------------------------------------------------
def record(message: IncomingMessage, *, always_base64: bool = False) -> dict[str, Any]:
    """The JSON object of *message*: ``body`` when it is UTF-8 text, else ``body_base64``."""
    result: dict[str, Any] = {
        "id": str(message.id),
        "message_id": message.message_id,
        "headers": message.headers if message.headers_error is None else message.raw_headers,
    }
    body = message.body or b""
    text = None if always_base64 else _utf8(body)
    if text is None:
        result["body_base64"] = base64.b64encode(body).decode("ascii")
    else:
        result["body"] = text
    result["expired"] = message.expired
    if message.headers_error is not None:
        result["headers_error"] = message.headers_error
        raw: object = message.raw_headers
        if isinstance(raw, bytes):  # headers kept as bytes (not text): JSON cannot hold them
            result["headers"] = None
            result["headers_base64"] = base64.b64encode(raw).decode("ascii")
    return result


def _utf8(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


#: Characters of a body a plain ``browse`` line shows, unless ``--full-body``.
BODY_SHOWN = 200


def _more(body: bytes, shown: int) -> str:
    """The marker after a body cut to its first *shown* bytes (empty when it is whole)."""
    if shown >= len(body):
        return ""
    return f" ... [{len(body):,} bytes, the first {shown:,} shown; --full-body shows all]"


def line_of(message: IncomingMessage, args: argparse.Namespace) -> str:
    """One output line: a JSON object (``--json``) or ``MESSAGE_ID[ (expired)]: BODY``.

    Without ``--json``, ``browse`` shows the first :data:`BODY_SHOWN` characters of a body and
    a marker saying how long it is, unless ``--full-body``; ``receive`` and JSON always write
    the whole body.
    """
    always_base64 = bool(getattr(args, "base64", False))
    if args.json:
        return json.dumps(record(message, always_base64=always_base64), ensure_ascii=False)
    cut = not getattr(args, "full_body", True)
    state = " (expired)" if message.expired else ""
    message_id = listings.printable(message.message_id)
    body = message.body or b""
    text = None if always_base64 else _utf8(body)
    if text is None or "\n" in text or "\r" in text:
        shown = body[: BODY_SHOWN // 4 * 3] if cut else body
        encoded = base64.b64encode(shown).decode("ascii")
        return f"{message_id}{state} base64: {encoded}{_more(body, len(shown))}"
    if cut and len(text) > BODY_SHOWN:
        text = text[:BODY_SHOWN]
        return f"{message_id}{state}: {listings.printable(text)}{_more(body, len(text.encode()))}"
    return f"{message_id}{state}: {listings.printable(text)}"


class HandOver:
    """Writes lines to standard output and knows whether they were handed over.

    A write that fails (``EPIPE``, a full disk) raises :class:`failures.OutputClosed`. On a pipe,
    a line counts as handed over only once the reader has read it: before the next line and
    before the commit we wait until the pipe is empty, and a reader that went away first
    (``head -1``) is a closed output. Files and terminals are handed over once flushed.

    A reader that is alive but reads nothing for :data:`PATIENCE` seconds (one that reads only
    once we have exited) would wait for us while we wait for it: we stop waiting and count what
    is in the pipe as handed over, as a plain write would.
    """

    def __init__(self, stream: IO[str], queue: str = "") -> None:
        self.stream = stream
        self.queue = queue
        try:
            self.fd: int | None = stream.fileno()
            self.pipe = stat.S_ISFIFO(os.fstat(self.fd).st_mode)
        except (OSError, ValueError, AttributeError):
            self.fd, self.pipe = None, False

    def write(self, line: str) -> None:
        """Write *line* and a newline, flushed; on a pipe, wait until it was read."""
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except OSError as error:
            reason = error.strerror or error
            raise failures.OutputClosed(f"standard output closed ({reason})") from error
        if self.pipe:
            self._wait_until_read()

    def _wait_until_read(self) -> None:
        assert self.fd is not None
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        pause = 0.0
        last_unread, since = -1, time.monotonic()
        while True:
            for _fd, event in poller.poll(0):
                if event & (select.POLLERR | select.POLLHUP):
                    raise failures.OutputClosed("standard output closed (the reader went away)")
            unread = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            if unread == 0:
                return
            now = time.monotonic()
            if unread != last_unread:
                last_unread, since = unread, now
            elif now - since > PATIENCE:
                log.info("queue %s: the reader of standard output read nothing for %gs; "
                         "no longer waiting for it", self.queue, PATIENCE)
                self.pipe = False
                return
            time.sleep(pause)
            pause = min(0.05, pause * 2 or 0.0005)


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's last flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


# -- commands -----------------------------------------------------------------------------------
def _cmd_create_queue(args: argparse.Namespace) -> int:
    transport = _context(args).transport
    if args.sql_server_layout != "clustered":  # a transport on the same engine, laid out so
        from sqlqueue_orm.transport import Transport

        transport = Transport(transport.engine, sql_server_layout=args.sql_server_layout)
    for name in args.names:
        created = transport.create_queue(name, body_string=args.body_string)
        print(f"{'created' if created else 'exists '} {name}")
    return 0


def _read_body(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise exceptions.ConfigurationError(
            f"--body-file {path!r}: {error.strerror or error}"
        ) from error


def _cmd_send(args: argparse.Namespace) -> int:
    body = args.body.encode("utf-8") if args.body is not None else _read_body(args.body_file)
    message = OutgoingMessage(
        body=body,
        headers=dict(args.header or []),
        message_id=args.message_id,
        time_to_be_received=args.ttbr,
    )
    print(_context(args).transport.send(args.queue, message))
    return 0


def _cmd_receive(args: argparse.Namespace) -> int:
    transport = _context(args).transport
    output = HandOver(sys.stdout, args.queue)
    taken = 0
    try:
        # One transaction: the rows are deleted only if every line was handed over.
        with transport.begin() as connection:
            messages = transport.receive(args.queue, max_messages=args.count,
                                         connection=connection)
            taken = len(messages)
            for message in messages:
                output.write(line_of(message, args))
    except failures.OutputClosed as error:
        _silence_stdout()
        log.info("queue %s: output closed; %d message(s) rolled back, none lost",
                 args.queue, taken)
        raise failures.OutputClosed(
            f"{error}; the {taken} message(s) taken off queue {args.queue!r} were put back"
        ) from error
    return 0


def _cmd_browse(args: argparse.Namespace) -> int:
    messages = _context(args).transport.browse(args.queue, max_messages=args.count)
    handover = HandOver(sys.stdout, args.queue)
    try:
        if not messages:
            empty = f"no messages in queue {args.queue!r}"
            handover.write(listings.EMPTY_JSON if args.json else empty)
        for message in messages:
            handover.write(line_of(message, args))
    except failures.OutputClosed:
        _silence_stdout()  # browsing takes nothing: an early close loses nothing
    return 0


#: ``peek`` counts a queue of up to this many messages exactly; beyond, it estimates.
EXACT_UP_TO = 1000


def _cmd_peek(args: argparse.Namespace) -> int:
    from sqlqueue_orm import browsing, db
    from sqlqueue_orm.addressing import QueueAddress

    transport = _context(args).transport
    estimate = transport.peek(args.queue)  # a missing queue, an outdated layout: said here
    address = QueueAddress.parse(args.queue, transport.engine.dialect.name)
    with db.reading(transport.engine) as connection:
        counted = browsing.count_queue(connection, address, EXACT_UP_TO)
    print(estimate if counted is None else counted)
    return 0


def _cmd_purge_expired(args: argparse.Namespace) -> int:
    print(_context(args).transport.purge_expired(args.queue, batch_size=args.batch))
    return 0


def _confirm(queue: str, assume_yes: bool, stdin: IO[str]) -> None:
    """Ask on a terminal; without one, refuse unless ``--yes``."""
    if assume_yes:
        return
    if not stdin.isatty():
        raise exceptions.ConfigurationError(
            f"purge-all {queue!r} deletes every message: standard input is not a terminal, so "
            "nothing was asked and nothing deleted; add --yes"
        )
    print(f"Delete every message of queue {queue!r}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise exceptions.ConfigurationError(f"purge-all {queue!r}: not confirmed, nothing deleted")


def _cmd_purge_all(args: argparse.Namespace) -> int:
    from sqlqueue_orm.addressing import QueueAddress

    transport = _context(args).transport
    QueueAddress.parse(args.queue, transport.engine.dialect.name)  # a bad name fails first
    _confirm(args.queue, args.yes, sys.stdin)
    print(transport.purge_all(args.queue))
    return 0


def user_schemas(engine: sa.Engine) -> list[str | None]:
    """The default schema (as None) and every other schema that is not the database's own."""
    import sqlalchemy as sa

    from sqlqueue_orm import db, dialects

    with db.reading(engine) as connection:
        inspector = sa.inspect(connection)
        default = inspector.default_schema_name
        names = inspector.get_schema_names()
    support = dialects.for_dialect(engine)
    chosen: list[str | None] = [None]
    for name in sorted(names):
        lowered = name.lower()
        if name == default or lowered in support.system_schemas:
            continue
        if lowered.startswith(support.system_schema_prefixes):
            continue
        chosen.append(name)
    return chosen


def _cmd_list_queues(args: argparse.Namespace) -> int:
    transport = _context(args).transport
    schemas: Iterable[str | None] = args.schema or user_schemas(transport.engine)
    listings.show(
        list(transport.list_queues(schemas)),
        as_json=args.json,
        record=lambda queue: {"queue": queue[0], "count": queue[1]},
        line=lambda queue: f"{listings.printable(queue[0])}\t{queue[1]}",
        none="no queues",
    )
    return 0


def _queue_name(text: str) -> str:
    """Argument type: a queue address that parses (the database checks the rest)."""
    from sqlqueue_orm.addressing import QueueAddress

    try:
        QueueAddress.parse(arguments.utf8_text(text))
    except exceptions.ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def register(commands: Any) -> None:
    """Add the queue sub-commands to the ``sqlqueue`` parser."""
    sub = commands.add_parser("create-queue", help="create queue tables (idempotent)")
    sub.add_argument("names", nargs="+", metavar="NAME", type=_queue_name)
    sub.add_argument("--body-string", action="store_true", help="add the BodyString column")
    sub.set_defaults(creates_database=True)
    arguments.sql_server_layout(sub)
    sub.set_defaults(func=_cmd_create_queue)

    sub = commands.add_parser("send", help="send one message")
    sub.add_argument("queue", type=_queue_name)
    body = sub.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", type=arguments.utf8_text, help="the body, as UTF-8 text")
    body.add_argument("--body-file", type=arguments.input_file, metavar="PATH",
                      help="the body: the bytes of PATH, or of standard input with -")
    sub.add_argument("--header", action="append", type=arguments.key_value, metavar="K=V")
    sub.add_argument("--ttbr", type=arguments.ttbr_seconds, metavar="SECONDS",
                     help="time to be received (at most 100 years)")
    sub.add_argument("--message-id", type=arguments.utf8_text,
                     help="NServiceBus.MessageId (default: a new GUID)")
    sub.set_defaults(func=_cmd_send)

    for name, func, helptext in (
        ("receive", _cmd_receive, "take messages off a queue (put back if not all written)"),
        ("browse", _cmd_browse, "show messages, oldest first, without taking them"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("queue", type=_queue_name)
        sub.add_argument("--count", type=arguments.batch_count, default=1 if name == "receive"
                         else 10, metavar="N", help=f"1 to {arguments.MAX_BATCH}")
        sub.add_argument("--json", action="store_true",
                         help="one JSON object a line: id, message_id, headers, body or "
                         "body_base64, expired")
        sub.add_argument("--base64", action="store_true",
                         help="always give the body as base64 (body_base64)")
        if name == "browse":
            sub.add_argument("--full-body", action="store_true",
                             help=f"the whole body of each message (default: its first "
                             f"{BODY_SHOWN} characters and its length; --json: always whole)")
        sub.set_defaults(func=func)

    sub = commands.add_parser(
        "peek", help=f"message count: exact up to {EXACT_UP_TO}, estimated beyond"
    )
    sub.add_argument("queue", type=_queue_name)
    sub.set_defaults(func=_cmd_peek)

    sub = commands.add_parser("purge-expired", help="delete expired messages in batches")
    sub.add_argument("queue", type=_queue_name)
    sub.add_argument("--batch", type=arguments.bounded_int(1, 100_000), default=10_000,
                     metavar="N")
    sub.set_defaults(func=_cmd_purge_expired)

    sub = commands.add_parser("purge-all", help="delete every message of a queue (asks first)")
    sub.add_argument("queue", type=_queue_name)
    sub.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")
    sub.set_defaults(func=_cmd_purge_all)

    sub = commands.add_parser("list-queues", help="queue tables with estimated counts")
    sub.add_argument("--schema", action="append",
                     help="schema to look in (repeatable; default: every schema but the "
                     "database's own)")
    sub.add_argument("--json", action="store_true",
                     help="one JSON object a line: queue, count (an estimate); [] for none")
    sub.set_defaults(func=_cmd_list_queues)

