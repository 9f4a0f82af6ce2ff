"""Which queue tables a migration run touches: found by column signature, or named.

Online, every table of the configured schemas whose columns include the queue signature
(``Id, Expires, Headers, Body, RowVersion``, or NServiceBus's PostgreSQL ``id, expires, headers,
body, seq``, as :mod:`sqlqueue_orm.schema`) is a queue table,
whatever its name; any other table is never touched. Named queues (``-x queues=a,b``) narrow the
run to those tables, and each must exist and carry the signature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from sqlalchemy.engine import Connection

from sqlqueue_orm import addressing, db, exceptions, schema


def split_names(text: str) -> list[str]:
    """Split ``a,[b,c],d`` on the commas outside brackets (``]]`` escapes ``]``)."""
    names: list[str] = []
    current: list[str] = []
    depth = False
    i = 0
    while i < len(text):
        char = text[i]
        if char == "[" and not depth:
            depth = True
        elif char == "]" and depth:
            if text[i + 1 : i + 2] == "]":
                current.append("]]")
                i += 2
                continue
            depth = False
        if char == "," and not depth:
            names.append("".join(current).strip())
            current = []
        else:
            current.append(char)
        i += 1
    names.append("".join(current).strip())
    return [name for name in names if name]


def _unbracket(name: str) -> str:
    if len(name) >= 2 and name.startswith("[") and name.endswith("]"):
        return name[1:-1].replace("]]", "]")
    return name


@dataclasses.dataclass(frozen=True)
class Target:
    """The schemas a run looks in (``None``: the default one) and, optionally, named queues."""

    schemas: tuple[str | None, ...] = (None,)
    queues: tuple[addressing.QueueAddress, ...] = ()
    #: SQL Server: rebuild heaps (NServiceBus 8+ layout) clustered; by default they are kept.
    cluster_heaps: bool = False

    @classmethod
    def parse(
        cls, schemas: Iterable[str] = (), queues: Iterable[str] = (), cluster_heaps: bool = False
    ) -> Target:
        """From ``-x schema=a,b`` / ``--schema`` values and ``-x queues=q1,q2@[s]`` values.

        :param schemas: schema names, each possibly a comma-separated list (``[a,b]`` keeps a
            comma in a name).
        :param queues: queue addresses (``table@[schema]``), each possibly comma-separated.
        :param cluster_heaps: see :attr:`cluster_heaps`.
        """
        schema_names: list[str | None] = []
        for text in schemas:
            for name in split_names(text):
                name = _unbracket(name)
                if "\x00" in name:
                    raise exceptions.ConfigurationError(f"invalid schema name {name!r}")
                if name not in schema_names:
                    schema_names.append(name)
        addresses: list[addressing.QueueAddress] = []
        for text in queues:
            for name in split_names(text):
                address = addressing.QueueAddress.parse(name)
                if address.catalog is not None:
                    raise exceptions.ConfigurationError(
                        f"queue {name!r} names a catalog; migrate each database by connecting to it"
                    )
                if address not in addresses:
                    addresses.append(address)
        return cls(tuple(schema_names) or (None,), tuple(addresses), cluster_heaps)

    def addresses(self) -> list[addressing.QueueAddress]:
        """The named queues, each without a schema looked for in every configured schema."""
        found: list[addressing.QueueAddress] = []
        for queue in self.queues:
            candidates = (
                [queue]
                if queue.schema is not None
                else [addressing.QueueAddress(queue.table, name) for name in self.schemas]
            )
            found += [address for address in candidates if address not in found]
        return found


def find(connection: Connection, target: Target) -> list[addressing.QueueAddress]:
    """The queue tables of *target* in the database of *connection*.

    :raises ConfigurationError: a named queue is missing, or its table is not a queue table.
    """
    if not target.queues:
        return [
            info.address
            for info in schema.SchemaInspector().find_queue_tables(connection, target.schemas)
        ]
    found = []
    for queue in target.queues:
        hits = []
        for address in Target(target.schemas, (queue,)).addresses():
            address.check_for(connection.dialect.name)
            columns = db.column_names(connection, address)
            if not columns:
                continue
            missing = sorted(schema.QUEUE_SIGNATURE - columns)
            if missing and not schema.is_queue_table(columns):
                raise exceptions.ConfigurationError(
                    f"table {str(address)!r} is not a queue table (no {', '.join(missing)}); "
                    "it is left alone, so do not name it"
                )
            hits.append(address)
        if not hits:
            where = ", ".join(
                "the default schema" if s is None else repr(s) for s in target.schemas
            )
            raise exceptions.ConfigurationError(f"queue {str(queue)!r}: no such table in {where}")
        found += [address for address in hits if address not in found]
    return found
