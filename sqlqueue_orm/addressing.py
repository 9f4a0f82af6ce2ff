"""Queue addresses in the forms the .NET NServiceBus SQL transports write them.

SQL Server form, ``table@[schema]@[catalog]`` (``SqlServer/Addressing/QueueAddress.cs`` and
``SqlServerNameHelper.cs`` of Particular/NServiceBus.SqlServer at 214c4e8f): the table runs up to
the first ``@``; schema and catalog may be bracket-delimited (``]]`` stands for ``]``, and ``@``
may appear inside), an empty ``[]`` schema stands for "none" when a catalog follows, and a part
that is only whitespace counts as none. One extension of ours: a table holding ``@`` (or starting
with ``[``) is written bracketed, ``[my@queue]@[dbo]``, which NServiceBus cannot express at all.

PostgreSQL form, ``"schema"."table"`` (``PostgreSql/Addressing/QueueAddress.cs`` and
``PostgreSqlNameHelper.cs``, same commit): split at the first ``.`` outside double quotes; each
part double-quoted with ``""`` for ``"``, or bare (then taken as written, not case-folded).

:meth:`QueueAddress.parse` and :meth:`QueueAddress.format` take the dialect name and pick the
form its ``DialectSupport.address_form`` names: the PostgreSQL one on PostgreSQL, the SQL Server
one anywhere else. :meth:`QueueAddress.qualified` gives a PostgreSQL address without a schema
the connection's current one, as the .NET transport writes every address (``"public"."sales"``).
On PostgreSQL a text is read in the PostgreSQL form when it holds a double quote (as every
address .NET writes does: it always quotes both parts) and no ``@`` outside double quotes; any
other text keeps the ``table@[schema]`` form this library has always read, so ``Samples.Sales``
stays one table name (NServiceBus would read a bare ``Samples.Sales`` as schema ``Samples``; it
never writes one). Names are never spliced into SQL: they reach the database
only through SQLAlchemy's identifier quoting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sqlqueue_orm import dialects, exceptions


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


def _next_part(text: str) -> tuple[str, str, bool]:
    """A schema or catalog part, as QueueAddress.ExtractNextPart (.NET) cuts it.

    It ends at the first ``@`` -- for a part starting with ``[``, the first after an odd number
    of ``]`` -- and is unbracketed only if it both starts with ``[`` and ends with ``]``. An empty
    part (``q@@[cat]``, our own old way of writing "no schema") is read as empty.
    """
    if text.startswith("@"):
        return "", text[1:], True
    right_brackets = 0
    for index in range(1, len(text)):
        char = text[index]
        if char == "@" and (text[0] != "[" or right_brackets % 2 == 1):
            return _unbracket(text[:index]), text[index + 1 :], True
        if char == "]":
            right_brackets += 1
    return _unbracket(text), "", False


def _unquote(name: str, opening: str, closing: str) -> str:
    """Strip one pair of quote characters and undo the doubled closing one; else as written."""
    if len(name) >= 2 and name.startswith(opening) and name.endswith(closing):
        return name[1:-1].replace(closing * 2, closing)
    return name


def _quote(name: str, opening: str, closing: str) -> str:
    return opening + name.replace(closing, closing * 2) + closing


def _unbracket(part: str) -> str:
    """SqlServerNameHelper.Unquote."""
    return _unquote(part, "[", "]")


def _bracket(name: str) -> str:
    return _quote(name, "[", "]")


def _blank_to_none(name: str | None) -> str | None:
    """NServiceBus's SafeUnquote: a part that is empty or only whitespace is no part."""
    return None if name is None or name.strip() == "" else name


def _outside_quotes(text: str, char: str) -> int:
    """Index of the first *char* outside double quotes in *text*, or -1 (an even quote count)."""
    quotes = 0
    for index, current in enumerate(text):
        if current == '"':
            quotes += 1
        elif current == char and quotes % 2 == 0:
            return index
    return -1


def _pg_unquote(name: str) -> str:
    """PostgreSqlNameHelper.Unquote: strip one pair of ``"`` and undo ``""``; else as written."""
    return _unquote(name, '"', '"')


def _pg_quote(name: str) -> str:
    return _quote(name, '"', '"')


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

    def _parts(self) -> tuple[tuple[str, str | None], ...]:
        """Each part of the address with its name, innermost first."""
        return (("table", self.table), ("schema", self.schema), ("catalog", self.catalog))

    def __post_init__(self) -> None:
        for what, value in self._parts():
            if value is None:
                continue
            if not isinstance(value, str):
                raise exceptions.ConfigurationError(f"queue {what} must be a string, not {value!r}")
            if value.strip() == "":
                # NServiceBus refuses a blank table and reads a blank schema/catalog as none.
                raise exceptions.InvalidQueueName(
                    value, f"the {what} name is {'empty' if value == '' else 'only whitespace'}"
                )
            if "\x00" in value:
                raise exceptions.InvalidQueueName(value, f"the {what} name holds a NUL character")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: no database or driver can store it
                raise exceptions.InvalidQueueName(
                    value, f"the {what} name is not valid Unicode text (a lone surrogate)"
                ) from None

    @classmethod
    def parse(cls, address: str, dialect: str | None = None) -> QueueAddress:
        """Parse *address* in the form of *dialect*'s .NET transport (see the module docstring).

        :param address: ``table@[schema]@[catalog]``, or on PostgreSQL ``"schema"."table"``.
        :param dialect: a SQLAlchemy dialect name; ``None`` reads the SQL Server form.
        :raises ConfigurationError: naming *address* when it cannot be read.
        """
        if not isinstance(address, str) or address == "":
            raise exceptions.InvalidQueueName(str(address), "the address is empty")
        schema_qualified = (
            dialects.for_dialect(dialect).address_form is dialects.AddressForm.SCHEMA_QUALIFIED
        )
        if schema_qualified and '"' in address and _outside_quotes(address, "@") < 0:
            return cls._parse_postgresql(address)
        return cls._parse_sql_server(address)

    @classmethod
    def _parse_postgresql(cls, address: str) -> QueueAddress:
        dot = _outside_quotes(address, ".")
        schema_part = None if dot < 0 else address[:dot]
        table = _blank_to_none(_pg_unquote(address[dot + 1 :]))
        if table is None:
            raise exceptions.InvalidQueueName(address, "the table name is empty")
        schema = None if schema_part is None else _blank_to_none(_pg_unquote(schema_part))
        return cls(table, schema)

    @classmethod
    def _parse_sql_server(cls, address: str) -> QueueAddress:
        table, rest, more = _read_part(address)
        schema = catalog = None
        if more:
            schema, rest, more = _next_part(rest)
        if more:
            catalog, rest, more = _next_part(rest)
        if more:
            raise exceptions.ConfigurationError(
                f"invalid queue address {address!r}: more than three '@'-separated parts "
                "(put a name holding '@' in brackets: [name])"
            )
        if table == "":
            raise exceptions.InvalidQueueName(address, "the table name is empty")
        return cls(table, _blank_to_none(schema), _blank_to_none(catalog))

    @classmethod
    def coerce(cls, queue: str | QueueAddress, dialect: str | None = None) -> QueueAddress:
        """Return *queue* as an address, parsing strings in *dialect*'s form."""
        return queue if isinstance(queue, QueueAddress) else cls.parse(queue, dialect)

    def qualified(
        self, dialect: str | None, current_schema: Callable[[], str | None]
    ) -> QueueAddress:
        """The address as *dialect*'s .NET transport names it: with a schema, on PostgreSQL.

        The PostgreSQL transport always writes ``"schema"."table"``, and .NET's subscriber
        look-up and ServiceControl compare those texts: an address without a schema gets the
        connection's, ``current_schema()`` (asked only then). Anywhere else, and when
        *current_schema* gives none, the address is returned as it is.
        """
        if self.schema is not None or (
            dialects.for_dialect(dialect).address_form is not dialects.AddressForm.SCHEMA_QUALIFIED
        ):
            return self
        schema = current_schema()
        return self if schema is None else QueueAddress(self.table, schema, self.catalog)

    def format(self, dialect: str | None = None) -> str:
        """The address as *dialect*'s .NET transport writes it (``str()``: the SQL Server form).

        :raises ConfigurationError: a catalog on PostgreSQL, which has no form for it.
        """
        if dialects.for_dialect(dialect).address_form is not dialects.AddressForm.SCHEMA_QUALIFIED:
            return str(self)
        if self.catalog is not None:
            raise exceptions.ConfigurationError(
                f"queue {str(self)!r} names catalog {self.catalog!r}; a PostgreSQL address "
                "has no catalog"
            )
        table = _pg_quote(self.table)
        return table if self.schema is None else f"{_pg_quote(self.schema)}.{table}"

    def __str__(self) -> str:
        table = self.table
        if "@" in table or table.startswith("["):
            table = _bracket(table)
        parts = [table]
        if self.schema is not None or self.catalog is not None:
            # "[]", not "": NServiceBus reads "q@@[cat]" as schema "@[cat]" (QueueAddress.cs).
            parts.append(_bracket(self.schema) if self.schema is not None else "[]")
        if self.catalog is not None:
            parts.append(_bracket(self.catalog))
        return "@".join(parts)

    def check_for(self, dialect_name: str) -> None:
        """Raise :class:`InvalidQueueName` if the dialect cannot hold these names."""
        support = dialects.for_dialect(dialect_name)
        limit = support.identifier_limit
        for what, value in self._parts():
            if value is None:
                continue
            size = support.identifier_size(value)
            if size > limit:
                raise exceptions.InvalidQueueName(
                    value,
                    f"the {what} name is {size} {support.identifier_unit}; "
                    f"{dialect_name} allows {limit}",
                )
        reserved = support.reserved_name(self.table, self.schema)
        if reserved is not None:
            raise exceptions.InvalidQueueName(
                str(self), f"the name is reserved for the database's own tables ({reserved})"
            )
        if self.catalog is not None and not support.cross_catalog:
            raise exceptions.ConfigurationError(
                f"queue {str(self)!r} names catalog {self.catalog!r}; only SQL Server queues "
                "may live in another catalog (connect to that database instead)"
            )
