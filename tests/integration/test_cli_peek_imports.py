"""``sqlqueue peek`` loads SQLAlchemy's package of its own database only, and not the ORM; so
does making a delayed table.

A command that reaches one database needs that dialect and SQLAlchemy's core: the other
dialects' packages and the ORM (which only the shared tables' models and the endpoint's
sessions use) are start-up time it does not need. Checked structurally (which modules the
process holds), not by a clock: the time is measured by the ``cli`` cell of
``python -m benchmarks``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import DIALECTS


def _loaded(code: str, prefix: str) -> list[str]:
    """The modules whose names start with *prefix* a fresh process holds after running *code*."""
    probe = code + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps(sorted(name for name in sys.modules if name.startswith({prefix!r}))))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def _unneeded(dialect: str, code: str) -> list[str]:
    """What of SQLAlchemy a fresh process running *code* on *dialect* loads without needing it:
    the ORM and the other dialects' packages (it must load its own)."""
    loaded = _loaded(code, "sqlalchemy.")
    assert f"sqlalchemy.dialects.{dialect}" in loaded
    others = [f"sqlalchemy.dialects.{name}" for name in DIALECTS if name != dialect]
    return [
        name for name in loaded
        if any(name == package or name.startswith(f"{package}.")
               for package in (*others, "sqlalchemy.orm"))
    ]


def test_peek_loads_only_its_own_dialect_and_not_the_orm(database):
    database.transport().create_queue("billing")
    code = textwrap.dedent(
        f"""
        from sqlqueue_orm.cli import main
        assert main(["--url", {database.url!r}, "peek", "billing"]) == 0
        """
    )
    assert _unneeded(database.dialect, code) == []


def test_peek_loads_no_other_dialects_statements(database):
    """The other dialects' modules of this package (their statements, built at import) are not
    loaded by a peek on this one."""
    database.transport().create_queue("billing")
    code = textwrap.dedent(
        f"""
        from sqlqueue_orm.cli import main
        assert main(["--url", {database.url!r}, "peek", "billing"]) == 0
        """
    )
    others = [f"sqlqueue_orm.dialects.{name}" for name in DIALECTS if name != database.dialect]
    assert [name for name in _loaded(code, "sqlqueue_orm.dialects.") if name in others] == []


def test_a_delayed_table_is_made_loading_only_its_own_dialect(database):
    code = textwrap.dedent(
        f"""
        from sqlqueue_orm import Transport
        with Transport({database.url!r}) as transport:
            assert transport.create_delayed_table("billing")
        """
    )
    assert _unneeded(database.dialect, code) == []
