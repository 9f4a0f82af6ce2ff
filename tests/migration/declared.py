"""What autogenerate and verify find different in the library's declared tables of a database."""

from __future__ import annotations

from collections.abc import Sequence

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from sqlqueue_orm import verify
from sqlqueue_orm.models.base import Base
from tests.conftest import Database


def diffs(database: Database, names: Sequence[str]) -> list[object]:
    """Autogenerate's differences between the models and *database* that concern *names*."""
    with database.engine.connect() as connection:
        found = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    return [diff for diff in found if any(name in repr(diff) for name in names)]


def drifts(database: Database, names: Sequence[str]) -> list[verify.Drift]:
    """``sqlqueue verify``'s drifts of the tables *names* in *database*."""
    with database.engine.connect() as connection:
        return [d for d in verify.verify(connection) if any(n in d.table for n in names)]
