r"""How every listing of the ``sqlqueue`` command line is printed.

With ``--json``: one JSON object a line, and ``[]`` when there is nothing to list (so a script
always reads JSON). Without it: one line an item, or one line saying there is none (``no
queues``), so an empty result is not mistaken for a command that printed nothing; a listing of
columns heads them with a line of their names and aligns them.

One line an item, always: the values a plain listing prints pass through :func:`printable`,
which writes control characters (newline, carriage return, tab, the other C0 and C1 controls,
line and paragraph separators, the bidirectional controls) as escapes (``\n``, ``\x1b``,
``\u202e``), so a value cannot add a line, hide text or reorder what a terminal shows. JSON
output is unchanged: it holds every value exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

Item = TypeVar("Item")

#: What ``--json`` prints when there is nothing to list.
EMPTY_JSON = "[]"
#: Between two columns of a plain listing.
GAP = "  "

# C0, DEL and C1 controls; the Arabic letter mark, LRM/RLM, the line and paragraph separators,
# and the bidirectional embeddings, overrides and isolates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(value: object) -> str:
    """*value* as text on one line: control characters written as escapes (see the module)."""
    text = str(value)
    if text.isprintable():  # the usual value: nothing to escape
        return text
    return _CONTROL.sub(_escape, text)


def columns(heading: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """*heading* and *rows* as aligned lines, every value :func:`printable`.

    The last column is not padded.
    """
    cells = [list(heading)] + [[printable(value) for value in row] for row in rows]
    widths = [max(len(row[index]) for row in cells) for index in range(len(heading) - 1)]
    return [
        GAP.join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)),
                  row[-1]])
        for row in cells
    ]


def json_line(record: Any) -> str:
    """*record* as one line of JSON (non-ASCII text kept as it is, not escaped)."""
    return json.dumps(record, ensure_ascii=False)


def show(
    items: Sequence[Item],
    *,
    as_json: bool,
    record: Callable[[Item], Any],
    line: Callable[[Item], str] | None = None,
    none: str,
    write: Callable[[str], None] = print,
    heading: Sequence[str] = (),
    cells: Callable[[Item], Sequence[str]] | None = None,
) -> None:
    """Write *items*: ``record(item)`` as JSON lines, or ``line(item)``; *none* when empty.

    :param line: one item's plain line, its values already :func:`printable`.
    :param none: the line saying there is nothing (``no queues``), without ``--json``.
    :param write: writes one line (default: :func:`print`).
    :param heading: with *cells* instead of *line*: the names of the columns.
    :param cells: one item's values, one a column (made :func:`printable` here).
    """
    if not items:
        write(EMPTY_JSON if as_json else none)
        return
    if as_json:
        for item in items:
            write(json_line(record(item)))
        return
    if cells is not None:
        for text in columns(heading, [cells(item) for item in items]):
            write(text)
        return
    assert line is not None, "a plain listing needs line or cells"
    for item in items:
        write(line(item))
