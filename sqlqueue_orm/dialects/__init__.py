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

from sqlalchemy.engine import Connection, Dialect, Engine

from sqlqueue_orm.dialects import mssql, postgresql, sqlite
from sqlqueue_orm.dialects.base import (
    GENERIC,
    READS_ONLY,
    SQLSERVER_SIGNATURE,
    AddressForm,
    DialectSupport,
    QueueLayout,
)
from sqlqueue_orm.dialects.statements import FenceKind

__all__ = [
    "ALL",
    "LOCKED_MARKERS",
    "MISSING_COLUMN_MARKERS",
    "MISSING_TABLE_MARKERS",
    "READS_ONLY",
    "SQLSERVER_SIGNATURE",
    "TRANSIENT_MARKERS",
    "AddressForm",
    "DialectSupport",
    "FenceKind",
    "QueueLayout",
    "for_dialect",
    "for_url",
]

#: Every dialect this package supports, by SQLAlchemy's ``dialect.name``.
ALL: dict[str, DialectSupport] = {
    support.name: support for support in (mssql.SUPPORT, postgresql.SUPPORT, sqlite.SUPPORT)
}


#: The same, also by the other names users write in URLs (``postgres``).
_BY_URL_NAME: dict[str, DialectSupport] = {
    name: support
    for support in ALL.values()
    for name in (support.name, *support.url_schemes)
}


def _union(*groups: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(marker for group in groups for marker in group))


# A driver error does not say which database raised it, so errors are read with every dialect's
# markers at once (they do not overlap in meaning).
#: Lower-case fragments of a driver error for a missing table, on any dialect.
MISSING_TABLE_MARKERS = _union(*(support.missing_table_markers for support in ALL.values()))
#: The same for a missing column.
MISSING_COLUMN_MARKERS = _union(*(support.missing_column_markers for support in ALL.values()))
#: The same for a transient failure (deadlock, serialization failure, lost connection).
TRANSIENT_MARKERS = _union(*(support.transient_markers for support in ALL.values()))
#: The same for a write lock held past the busy timeout.
LOCKED_MARKERS = _union(*(support.locked_markers for support in ALL.values()))


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
    return ALL.get(name, GENERIC)


def for_url(backend: str) -> DialectSupport:
    """The :class:`DialectSupport` of a URL's database name (``postgresql``, ``postgres``).

    A name this package does not know gets the generic rules, as in :func:`for_dialect`.
    """
    return _BY_URL_NAME.get(backend, GENERIC)
