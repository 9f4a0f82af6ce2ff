"""Each dialect's migration class registers itself and implements every step that applies to it.

The step table (``steps.STEPS``) names the body of each step (``Step.method``); a dialect
missing one would otherwise fail only in a customer's migration. A dialect without a class is
refused, naming it. No database needed: this is the dispatch, the steps themselves are proven on
real databases in ``tests/migration/``.
"""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import mssql, mysql, postgresql, sqlite

from sqlqueue_orm import addressing, exceptions
from sqlqueue_orm.migration import impl, steps

DIALECTS = {
    "mssql": (mssql.dialect, "MssqlImpl"),
    "postgresql": (postgresql.dialect, "PostgresqlImpl"),
    "sqlite": (sqlite.dialect, "SqliteImpl"),
}


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_impl_for_finds_the_class_registered_by_dialect(name: str) -> None:
    make_dialect, class_name = DIALECTS[name]
    found = impl.impl_for(make_dialect())  # type: ignore[no-untyped-call]
    assert type(found).__name__ == class_name
    assert type(found).__dialect__ == name == found.name
    assert type(impl.impl_for(name)) is type(found)


@pytest.mark.parametrize("name", sorted(DIALECTS))
@pytest.mark.parametrize("direction", steps.DIRECTIONS)
def test_every_step_that_applies_has_a_body(name: str, direction: str) -> None:
    dialect = impl.impl_for(name)
    applicable = [revision for revision in steps.STEPS if dialect.applies_to(revision)]
    assert applicable, "no step applies"
    for revision in applicable:
        assert callable(dialect.body(revision, direction)), revision


def test_offline_scripts_only_where_the_server_loops() -> None:
    assert {name for name in DIALECTS if impl.impl_for(name).offline} == {"mssql", "postgresql"}
    assert [name for name in DIALECTS if impl.impl_for(name).transactional_ddl] == ["sqlite"]


def test_a_dialect_without_a_class_is_refused_naming_it() -> None:
    dialect = impl.impl_for(mysql.dialect())  # type: ignore[no-untyped-call]
    assert type(dialect) is impl.QueueTableImpl
    assert not dialect.offline
    address = addressing.QueueAddress("orders", None)
    with pytest.raises(exceptions.ConfigurationError, match="cannot be migrated on mysql"):
        dialect.table_statements("0001_expires_index", "upgrade", address)
    with pytest.raises(exceptions.ConfigurationError, match="cannot be migrated on mysql"):
        dialect.body("0001_expires_index", "upgrade")


def test_an_unknown_step_is_refused_naming_it() -> None:
    with pytest.raises(exceptions.ConfigurationError, match="0099_nothing"):
        impl.impl_for("postgresql").body("0099_nothing", "upgrade")
