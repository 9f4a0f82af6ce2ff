"""One home per dialect: what each database needs at run time, looked up by ``dialect.name``.

:mod:`~sqlqueue_orm.dialects.base` lists what a dialect provides (:class:`DialectSupport`),
with the statement groups of the hot path, the wake-up, locks and the stream's fence in
:mod:`~sqlqueue_orm.dialects.statements`, of flow control in
:mod:`~sqlqueue_orm.dialects.flow` and of live control in :mod:`~sqlqueue_orm.dialects.control`;
:mod:`~sqlqueue_orm.dialects.mssql`, :mod:`~sqlqueue_orm.dialects.postgresql` and
:mod:`~sqlqueue_orm.dialects.sqlite` hold one frozen instance each, with every statement the
dialect runs at run time: the hot path, delayed delivery, subscriptions, the wake-up trigger,
catalog reads, locks and the Spark stream's offsets. Code elsewhere asks :func:`for_dialect`
and never branches on ``dialect.name``; the migration steps live in :mod:`sqlqueue_orm.migration`.

This is a bottom layer: it imports only SQLAlchemy and :mod:`sqlqueue_orm.exceptions`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Dialect, Engine

from sqlqueue_orm import config
from sqlqueue_orm.dialects.base import (
    GENERIC,
    POSTGRESQL_IDENTIFIER_LIMIT,
    POSTGRESQL_SIGNATURE,
    READS_ONLY,
    SQLSERVER_SIGNATURE,
    AddressForm,
    DialectSupport,
    QueueLayout,
)
from sqlqueue_orm.dialects.statements import FenceKind

if TYPE_CHECKING:
    from sqlqueue_orm.dialects import mssql, postgresql, sqlite

    # Made on first use by __getattr__ (below).
    #: Every dialect this package supports, by SQLAlchemy's ``dialect.name``.
    ALL: dict[str, DialectSupport]
    MISSING_TABLE_MARKERS: tuple[str, ...]
    MISSING_COLUMN_MARKERS: tuple[str, ...]
    TRANSIENT_MARKERS: tuple[str, ...]
    LOCKED_MARKERS: tuple[str, ...]

__all__ = [
    "ALL",
    "LOCKED_MARKERS",
    "MISSING_COLUMN_MARKERS",
    "MISSING_TABLE_MARKERS",
    "NAMES",
    "POSTGRESQL_IDENTIFIER_LIMIT",
    "POSTGRESQL_SIGNATURE",
    "READS_ONLY",
    "SQLSERVER_SIGNATURE",
    "TRANSIENT_MARKERS",
    "AddressForm",
    "DialectSupport",
    "FenceKind",
    "QueueLayout",
    "for_dialect",
    "for_url",
    "mssql",
    "postgresql",
    "sqlite",
]

#: Every dialect this package supports, by SQLAlchemy's ``dialect.name``, which is also the name
#: of its module here. A dialect's module loads on first use, so a program on one database does
#: not build the others' statements; ``mssql``, ``postgresql`` and ``sqlite`` are attributes of
#: this package all the same.
NAMES = config.DIALECT_NAMES


def _module(name: str) -> Any:
    return importlib.import_module(f"{__name__}.{name}")


def _support(name: str) -> DialectSupport:
    support: DialectSupport = _module(name).SUPPORT
    return support


# A driver error does not say which database raised it, so errors are read with every dialect's
# markers at once (they do not overlap in meaning): each tuple is made on first use, loading every
# dialect's module, when an error is read.
_MARKERS = {
    # Lower-case fragments of a driver error for a missing table, on any dialect.
    "MISSING_TABLE_MARKERS": "missing_table_markers",
    # The same for a missing column.
    "MISSING_COLUMN_MARKERS": "missing_column_markers",
    # The same for a transient failure (deadlock, serialization failure, lost connection).
    "TRANSIENT_MARKERS": "transient_markers",
    # The same for a write lock held past the busy timeout.
    "LOCKED_MARKERS": "locked_markers",
}


def __getattr__(name: str) -> Any:
    """A dialect's module, :data:`ALL` (every dialect's support) or an error marker tuple.

    Each is loaded or made on first use and kept, so a program on one database loads only its
    own dialect's module until it reads an error or asks for every dialect.
    """
    value: Any
    if name in NAMES:
        return _module(name)
    if name == "ALL":
        value = {dialect: _support(dialect) for dialect in NAMES}
    elif name in _MARKERS:
        field = _MARKERS[name]
        value = tuple(dict.fromkeys(
            marker for dialect in NAMES for marker in getattr(_support(dialect), field)
        ))
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def for_dialect(dialect: str | Dialect | Engine | Connection | None) -> DialectSupport:
    """The :class:`DialectSupport` of *dialect* (a name, Dialect, Engine or Connection).

    A dialect this package does not know gets the generic rules (128-character names, no
    catalogs, no locks or hints), as it did before dialects had a home; ``None`` too.
    """
    if dialect is None:
        return GENERIC
    if isinstance(dialect, str):
        name = dialect
    elif isinstance(dialect, Engine | Connection):
        name = dialect.dialect.name
    else:
        name = dialect.name
    return _support(name) if name in NAMES else GENERIC


def for_url(backend: str) -> DialectSupport:
    """The :class:`DialectSupport` of a URL's database name (``postgresql``, ``postgres``).

    A name this package does not know gets the generic rules, as in :func:`for_dialect`. A
    dialect's own name loads only its module; another name is looked up in every dialect's
    ``url_schemes``.
    """
    if backend in NAMES:
        return _support(backend)
    for dialect in NAMES:
        support = _support(dialect)
        if backend in support.url_schemes:
            return support
    return GENERIC
