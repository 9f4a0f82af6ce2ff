"""How every listing of the ``sqlqueue`` command line is printed.

With ``--json``: one JSON object a line, and ``[]`` when there is nothing to list (so a script
always reads JSON). Without it: one line an item, or one line saying there is none (``no
queues``), so an empty result is not mistaken for a command that printed nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

Item = TypeVar("Item")

#: What ``--json`` prints when there is nothing to list.
EMPTY_JSON = "[]"


def json_line(record: Any) -> str:
    """*record* as one line of JSON (non-ASCII text kept as it is, not escaped)."""
    return json.dumps(record, ensure_ascii=False)


def show(
    items: Sequence[Item],
    *,
    as_json: bool,
    record: Callable[[Item], Any],
    line: Callable[[Item], str],
    none: str,
    write: Callable[[str], None] = print,
) -> None:
    """Write *items*: ``record(item)`` as JSON lines, or ``line(item)``; *none* when empty.

    :param none: the line saying there is nothing (``no queues``), without ``--json``.
    :param write: writes one line (default: :func:`print`).
    """
    if not items:
        write(EMPTY_JSON if as_json else none)
        return
    for item in items:
        write(json_line(record(item)) if as_json else line(item))
