"""The declarative base and its naming convention, so Alembic sees stable constraint names."""

from __future__ import annotations

from sqlalchemy import MetaData, Table
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Base of the shared tables (``OutboxData``, ...) that Alembic manages."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def table_of(model: type[Base]) -> Table:
    """The :class:`~sqlalchemy.Table` of the declarative *model*.

    SQLAlchemy types ``__table__`` as any FROM clause (a model may be mapped to a join); every
    model of this package is mapped to one table, which this checks.
    """
    table = model.__table__
    if not isinstance(table, Table):
        raise TypeError(f"{model.__name__} is not mapped to one table")
    return table
