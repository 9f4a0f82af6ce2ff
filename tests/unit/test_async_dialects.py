"""The asyncio drivers' dialects: a URL naming no driver gets the async one, and the hot path's
statements render in each async driver's paramstyle (aioodbc takes pyodbc's, tested already)."""

from __future__ import annotations

import types

import pytest
import sqlalchemy as sa

from sqlqueue_orm import dialects
from sqlqueue_orm.queuing import sql


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///q.db", "sqlite+aiosqlite"),
        ("postgresql://u@h/d", "postgresql+asyncpg"),
        ("postgres://u@h/d", "postgresql+asyncpg"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg"),
        ("mssql://u@h/d", "mssql+aioodbc"),
    ],
)
def test_a_url_naming_no_driver_gets_the_dialects_async_driver(url, expected):
    parsed = sa.make_url(url)
    support = dialects.for_url(parsed.get_backend_name())
    assert support.async_engine_url(parsed).drivername == expected


@pytest.mark.parametrize(
    ("drivername", "marker"),
    [
        ("postgresql+asyncpg", "$1"),
        ("postgresql+psycopg_async", "%(id)s"),
        ("sqlite+aiosqlite", "?"),
    ],
)
def test_the_hot_path_renders_in_the_async_drivers_paramstyle(drivername, marker):
    cls = sa.make_url(f"{drivername}://").get_dialect()
    assert cls.is_async
    support = dialects.for_dialect(cls.name)
    assert support.hot_path is not None
    # The paramstyle is all rendering reads.
    driver = types.SimpleNamespace(paramstyle=cls.default_paramstyle)
    statement = sql.render(support.hot_path.send, driver, '"orders"')  # type: ignore[arg-type]
    assert marker in statement.text
    assert ":id" not in statement.text
    assert statement.positional == (marker != "%(id)s")
