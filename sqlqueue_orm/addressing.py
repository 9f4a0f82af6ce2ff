"""Queue addresses in the NServiceBus SQL transport format ``table@[schema]@[catalog]``.

The table part may hold anything but ``@`` (it runs up to the first ``@``); any part may be
bracket-delimited, where ``]]`` stands for ``]`` and ``@`` may appear. Names are never spliced
into SQL: they reach the database only through SQLAlchemy's identifier quoting.
"""

from __future__ import annotations

import dataclasses

from sqlqueue_orm import exceptions

#: Longest identifier each dialect accepts: characters on SQL Server, UTF-8 bytes on PostgreSQL.
MAX_IDENTIFIER_LENGTH = {"mssql": 128, "postgresql": 63, "sqlite": 1024}


def _read_bracketed(text: str) -> tuple[str, str] | None:
    """Read ``[name]`` (``]]`` is ``]``) from the start of *text*; None if it is not that form."""
    out: list[str] = []
    i = 1
    while i < len(text):
        char = text[i]
        if char == "]":
            if text[i + 1 : i + 2] == "]":
                out.append("]")
                i += 2
                continue
            rest = text[i + 1 :]
            if rest and not rest.startswith("@"):
                return None
            return "".join(out), rest[1:]
        out.append(char)
        i += 1
    return None


def _read_part(text: str) -> tuple[str, str, bool]:
    """Read one part from the start of *text*: (name, what follows its ``@``, more follows)."""
    if text.startswith("["):
        bracketed = _read_bracketed(text)
        if bracketed is not None:
            name, rest = bracketed
            return name, rest, len(rest) < len(text) and text[len(text) - len(rest) - 1] == "@"
    part, sep, rest = text.partition("@")
    return part, rest, bool(sep)


def _bracket(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


@dataclasses.dataclass(frozen=True)
class QueueAddress:
    """Where a queue lives: its table, and optionally its schema and catalog (database).

    ::

        >>> QueueAddress.parse("orders@[sales]")
        QueueAddress(table='orders', schema='sales', catalog=None)
        >>> str(QueueAddress("a@b", "s]x"))
        '[a@b]@[s]]x]'
    """

    table: str
    schema: str | None = None
    catalog: str | None = None

    def __post_init__(self) -> None:
        for what, value in (
            ("table", self.table),
            ("schema", self.schema),
            ("catalog", self.catalog),
        ):
            if value is None:
                continue
            if not isinstance(value, str):
                raise exceptions.ConfigurationError(f"queue {what} must be a string, not {value!r}")
            if value == "":
                raise exceptions.InvalidQueueName(str(value), f"the {what} name is empty")
            if "\x00" in value:
                raise exceptions.InvalidQueueName(value, f"the {what} name holds a NUL character")

    @classmethod
    def parse(cls, address: str) -> QueueAddress:
        """Parse ``table@[schema]@[catalog]``; a bad one raises :class:`ConfigurationError`."""
        if not isinstance(address, str) or address == "":
            raise exceptions.InvalidQueueName(str(address), "the address is empty")
        table, rest, more = _read_part(address)
        schema = catalog = None
        if more:
            schema, rest, more = _read_part(rest)
        if more:
            catalog, rest, more = _read_part(rest)
        if more:
            raise exceptions.ConfigurationError(
                f"invalid queue address {address!r}: more than three '@'-separated parts "
                "(put a name holding '@' in brackets: [name])"
            )
        if table == "":
            raise exceptions.InvalidQueueName(address, "the table name is empty")
        return cls(table, schema or None, catalog or None)

    @classmethod
    def coerce(cls, queue: str | QueueAddress) -> QueueAddress:
        """Return *queue* as an address, parsing strings."""
        return queue if isinstance(queue, QueueAddress) else cls.parse(queue)

    def __str__(self) -> str:
        table = self.table
        if "@" in table or table.startswith("["):
            table = _bracket(table)
        parts = [table]
        if self.schema is not None or self.catalog is not None:
            parts.append(_bracket(self.schema) if self.schema is not None else "")
        if self.catalog is not None:
            parts.append(_bracket(self.catalog))
        return "@".join(parts)

    def check_for(self, dialect_name: str) -> None:
        """Raise :class:`InvalidQueueName` if the dialect cannot hold these names."""
        limit = MAX_IDENTIFIER_LENGTH.get(dialect_name, 128)
        for what, value in (
            ("table", self.table),
            ("schema", self.schema),
            ("catalog", self.catalog),
        ):
            if value is None:
                continue
            size = len(value.encode("utf-8")) if dialect_name == "postgresql" else len(value)
            if size > limit:
                unit = "bytes" if dialect_name == "postgresql" else "characters"
                raise exceptions.InvalidQueueName(
                    value, f"the {what} name is {size} {unit}; {dialect_name} allows {limit}"
                )
        if self.catalog is not None and dialect_name != "mssql":
            raise exceptions.ConfigurationError(
                f"queue {str(self)!r} names catalog {self.catalog!r}; only SQL Server queues "
                "may live in another catalog (connect to that database instead)"
            )
