"""Rendering the hot path's statements (send, receive, peek, purge) for one queue and driver.

The statements themselves are each dialect's :class:`~sqlqueue_orm.dialects.statements.SqlText`
(``dialects.for_dialect(dialect).hot_path``, like NServiceBus's ``ISqlConstants``). Templates use
``{table}`` for the queue table and ``:name`` for parameters. :func:`render` substitutes the table
name *as SQLAlchemy's identifier preparer quotes it* (which also doubles ``%`` for pyformat
drivers) and turns the parameters into the driver's paramstyle, so statements run through
``exec_driver_sql`` with no per-call compilation. No queue name ever reaches SQL any other way.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import quoted_name

from sqlqueue_orm import addressing, dialects, exceptions
from sqlqueue_orm.dialects.statements import SqlText as SqlText


def for_dialect(dialect: Dialect) -> SqlText:
    """The statements of *dialect*, or :class:`ConfigurationError` naming an unsupported one."""
    text = dialects.for_dialect(dialect).hot_path
    if text is None:
        supported = sorted(name for name, support in dialects.ALL.items() if support.hot_path)
        raise exceptions.ConfigurationError(
            f"database dialect {dialect.name!r} is not supported; use one of {supported}"
        )
    return text


def format_table(dialect: Dialect, address: addressing.QueueAddress) -> str:
    """The queue table's name as *dialect* quotes it (catalog, schema and table)."""
    preparer = dialect.identifier_preparer
    parts = []
    if address.catalog is not None:
        parts.append(preparer.quote_identifier(address.catalog))
    if address.schema is not None:
        parts.append(preparer.quote_schema(quoted_name(address.schema, quote=True)))
    elif address.catalog is not None:
        parts.append("")  # [catalog]..[table]: the default schema of that catalog
    parts.append(preparer.quote_identifier(address.table))
    return ".".join(parts)


_PARAM = re.compile(r"(?<![:\w]):([a-z_]+)\b")


@dataclasses.dataclass(frozen=True)
class Statement:
    """One statement rendered for a driver: its text and how to lay out its parameters.

    Always execute it with :meth:`params` (even when it takes none): for pyformat drivers the
    text has every literal ``%`` doubled, which only parameter substitution turns back.
    """

    text: str
    names: tuple[str, ...]
    positional: bool
    #: Picks the positional values out of a mapping, in order (built once: C-level, no loop).
    _pick: Callable[[Mapping[str, Any]], Any] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.names:
            pick: Callable[[Mapping[str, Any]], Any] = lambda _values: ()  # noqa: E731
        elif len(self.names) == 1:
            name = self.names[0]
            pick = lambda values: (values[name],)  # noqa: E731
        else:
            pick = operator.itemgetter(*self.names)
        object.__setattr__(self, "_pick", pick)

    def params(self, values: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        """Parameters for ``exec_driver_sql``: a tuple (qmark) or a dict (pyformat/named)."""
        if self.positional:
            return self._pick(values)  # type: ignore[no-any-return]
        return values


def render(
    template: str, dialect: Dialect, table: str, literals: Mapping[str, int] | None = None
) -> Statement:
    """Render *template* for *dialect*'s driver, with the already-quoted *table* name.

    :param literals: parameters written into the text as integer literals instead of being
        bound (the receive's row limit: PostgreSQL then plans the statement once, generically,
        instead of a custom plan per call). Only ``int`` values are accepted, never text.
    """
    style = dialect.paramstyle
    names: list[str] = []
    written = dict(literals or {})
    for name, value in written.items():
        if type(value) is not int:
            raise TypeError(f"literal {name!r} must be an int, not {value!r}")

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in written:
            return str(written[name])
        names.append(name)
        if style == "qmark":
            return "?"
        if style == "format":
            return "%s"
        if style == "pyformat":
            return f"%({name})s"
        if style == "named":
            return f":{name}"
        if style == "numeric":
            return f":{len(names)}"
        if style == "numeric_dollar":  # asyncpg
            return f"${len(names)}"
        raise exceptions.ConfigurationError(f"driver paramstyle {style!r} is not supported")

    text = _PARAM.sub(replace, template)
    if style in ("format", "pyformat"):
        # Literal % in the template (SQL Server's modulo) must reach these drivers doubled.
        text = text.replace("%", "%%").replace("%%s", "%s").replace("%%(", "%(")
    text = text.replace("{table}", table)
    positional = style in ("qmark", "format", "numeric", "numeric_dollar")
    return Statement(text, tuple(names), positional)

