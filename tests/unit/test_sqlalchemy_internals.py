"""SQLAlchemy's private names: used in one module only, and present in the installed release.

``sqlqueue_orm.sqlalchemy_internals`` lists what it relies on; these tests fail when the
installed SQLAlchemy renames one or changes a signature it calls, and when another module of the
package reaches into SQLAlchemy's private names itself.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

from sqlqueue_orm import sqlalchemy_internals

PACKAGE = Path(sqlalchemy_internals.__file__).resolve().parent


@pytest.fixture
def objects(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A live instance of each class the module reads, keyed as RELIED_ON names them."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'x.db'}", poolclass=QueuePool)
    index = sa.Index("ix", sa.Table("t", sa.MetaData(), sa.Column("c", sa.Integer)).c.c)
    index.ddl_if(dialect="sqlite")
    with engine.connect() as connection:
        yield {"Connection": connection, "Engine": engine, "QueuePool": engine.pool,
               "DialectKWArgs": index, "Column": sa.Column("c", sa.Integer)}
    engine.dispose()


def test_every_private_name_the_module_relies_on_exists(objects: dict[str, Any]) -> None:
    missing = [
        f"{owner}.{name}"
        for owner, names in sqlalchemy_internals.RELIED_ON.items()
        for name in names
        if not hasattr(objects[owner], name)
    ]
    assert missing == []


def test_the_private_methods_it_calls_take_the_arguments_it_passes() -> None:
    def positional(method: Any) -> list[str]:
        return [
            name for name, parameter in inspect.signature(method).parameters.items()
            if parameter.default is inspect.Parameter.empty and name != "self"
        ]

    assert positional(Connection._begin_impl) == ["transaction"]
    assert positional(Connection._commit_impl) == []
    # called as _handle_dbapi_exception(failure, None, None, None, None)
    assert len(positional(Connection._handle_dbapi_exception)) == 5
    assert positional(Engine._should_log_info) == []


def test_what_the_functions_read_is_what_sqlalchemy_says(objects: dict[str, Any]) -> None:
    connection: Connection = objects["Connection"]
    assert not sqlalchemy_internals.observed(connection)
    assert not sqlalchemy_internals.engine_observed(objects["Engine"])
    assert sqlalchemy_internals.max_overflow(objects["QueuePool"]) == 10
    assert sqlalchemy_internals.ddl_if_dialects(objects["DialectKWArgs"]) == "sqlite"
    driver_connection = sqlalchemy_internals.new_driver_connection(objects["Engine"])
    try:
        assert driver_connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        driver_connection.close()
    root = connection.begin()
    assert sqlalchemy_internals.is_current(root, connection)
    assert sqlalchemy_internals.commit_kept(connection, root)
    sqlalchemy_internals.begin_again(connection, root, begins_itself=False)
    assert connection.exec_driver_sql("SELECT 1").scalar_one() == 1
    root.rollback()
    assert not sqlalchemy_internals.is_current(root, connection)

    sa.event.listen(objects["Engine"], "before_cursor_execute", lambda *args: None)
    assert sqlalchemy_internals.engine_observed(objects["Engine"])
    assert sqlalchemy_internals.statements_observed(connection)


def _sqlalchemy_private_names(objects: dict[str, Any]) -> set[str]:
    names = {name for group in sqlalchemy_internals.RELIED_ON.values() for name in group}
    for value in objects.values():
        names |= {name for name in dir(value) if name.startswith("_") and not name.startswith("__")}
    return names


def test_no_other_module_of_the_package_reaches_into_sqlalchemy(objects: dict[str, Any]) -> None:
    private = _sqlalchemy_private_names(objects)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "sqlalchemy_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert found == []


def test_synchronous_code_awaited_on_an_asyncio_engine_uses_its_connections(tmp_path) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}")

    def synchronous() -> int:
        with engine.sync_engine.connect() as connection:
            return int(connection.exec_driver_sql("SELECT 7").scalar_one())

    async def main() -> int:
        try:
            return await sqlalchemy_internals.greenlet_spawn(synchronous)
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == 7

