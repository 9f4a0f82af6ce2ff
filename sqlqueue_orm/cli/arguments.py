"""Every argument type of the ``sqlqueue`` command line, validated one way.

Each type is a function from the text the user typed to a value, raising
:class:`argparse.ArgumentTypeError` with a message that quotes that text; the parser turns it
into one line on stderr and exit status 2. Every command group's module takes its argument
types from here.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from sqlqueue_orm.config import DEFAULT_URL, SQL_SERVER_LAYOUTS

#: Upper bound of a time to be received: the one :class:`~sqlqueue_orm.messages.OutgoingMessage`
#: accepts (100 years of 366 days); longer is a mistake, leave the TTBR unset instead.
MAX_TTBR_SECONDS = 100 * 366 * 86_400
#: Largest receive or browse batch (the hot path's own limit, ``queuing.sql.SqlText.max_batch``).
MAX_BATCH = 10_000


#: The environment variable of the database URL.
URL_VARIABLE = "SQLQUEUE_URL"
#: The help of ``--url``, before the command and after it alike.
URL_HELP = f"database URL (default: ${URL_VARIABLE}, else {DEFAULT_URL})"


def resolve_url(args: argparse.Namespace) -> str:
    """``--url``, else ``SQLQUEUE_URL``, else the embedded SQLite default."""
    return str(getattr(args, "url", None) or os.environ.get(URL_VARIABLE) or DEFAULT_URL)


def url_source(args: argparse.Namespace) -> str:
    """Where :func:`resolve_url` takes the URL from: ``option``, ``environment`` or ``default``."""
    if getattr(args, "url", None):
        return "option"
    return "environment" if os.environ.get(URL_VARIABLE) else "default"


def url_option(parser: argparse.ArgumentParser, *, default: object = None) -> None:
    """Add ``--url`` to *parser*.

    :param default: ``argparse.SUPPRESS`` on a command's parser: leaving it out there keeps a
        ``--url`` given before the command.
    """
    parser.add_argument("--url", default=default, metavar="URL", help=URL_HELP)


def defaulted_option(
    parser: argparse.ArgumentParser, option: str, default: object, text: str, **kwargs: Any
) -> None:
    """Add *option* with *default* to *parser*, its help *text* ending in ``(default …)``.

    The default in the help is written from *default* itself (a float as ``:g`` writes it), so
    ``--help`` cannot drift from the value the option takes. *kwargs* go to
    :meth:`~argparse.ArgumentParser.add_argument` (``type``, ``metavar``).
    """
    shown = f"{default:g}" if isinstance(default, float) else default
    parser.add_argument(option, default=default, help=f"{text} (default {shown})", **kwargs)


def key_value(text: str) -> tuple[str, str]:
    """Argument type ``KEY=VALUE`` (the value may hold ``=``)."""
    key, sep, value = utf8_text(text).partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def utf8_text(text: str) -> str:
    """Argument type: text that is valid UTF-8 (the shell may pass any bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise argparse.ArgumentTypeError(
            f"'{shown}' is not valid UTF-8 (give bytes with --body-file)"
        ) from None
    return text


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """Argument type: a whole number from *low* to *high* (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        return value

    parse.__name__ = "whole number"  # what argparse names in its own messages
    return parse


#: A whole number of at least 1.
positive_int = bounded_int(1)
#: A batch size of a receive or browse: 1 to :data:`MAX_BATCH`.
batch_count = bounded_int(1, MAX_BATCH)


def seconds(
    low: float = 0, *, allow_low: bool = False, high: float | None = None, high_name: str = ""
) -> Callable[[str], float]:
    """Argument type: a finite number of seconds above *low* (or equal, with *allow_low*).

    :param high: the largest value allowed, if any; *high_name* says it in words.
    """

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
        if value < low or (value == low and not allow_low):
            bound = f"at least {low:g}" if allow_low else f"more than {low:g}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound} seconds")
        if high is not None and value > high:
            name = f" ({high_name})" if high_name else ""
            raise argparse.ArgumentTypeError(
                f"{text!r} must be at most {high:.0f} seconds{name}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


#: A number of seconds above 0.
positive_seconds = seconds(0)
#: A number of seconds of 0 or more.
non_negative_seconds = seconds(0, allow_low=True)
#: A time to be received: above 0, at most 100 years.
ttbr_seconds = seconds(0, high=MAX_TTBR_SECONDS, high_name="100 years; leave --ttbr out instead")


def input_file(text: str) -> str:
    """Argument type: a readable file, or ``-`` for standard input.

    Not only regular files: ``/dev/null`` (an empty body), a named pipe or a shell's process
    substitution (``<(command)``) are read as well.
    """
    if text == "-":
        return text
    if os.path.isdir(text) or not os.path.exists(text):
        reason = "is a directory" if os.path.isdir(text) else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {reason}")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not readable")
    return text


def sql_server_layout(parser: argparse.ArgumentParser) -> None:
    """Add ``--sql-server-layout`` (how SQL Server queue tables are laid out) to *parser*."""
    parser.add_argument(
        "--sql-server-layout",
        choices=SQL_SERVER_LAYOUTS,
        default="clustered",
        help="SQL Server: clustered Index_RowVersion (default), or heap: the NServiceBus 8+ "
        "layout for tables shared with .NET endpoints",
    )
