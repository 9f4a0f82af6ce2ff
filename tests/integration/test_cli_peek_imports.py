"""``sqlqueue peek`` loads SQLAlchemy's package of its own database only, and not the ORM.

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


def test_peek_loads_only_its_own_dialect_and_not_the_orm(database):
    database.transport().create_queue("billing")
    probe = textwrap.dedent(
        f"""
        import json, sys
        from sqlqueue_orm.cli import main
        status = main(["--url", {database.url!r}, "peek", "billing"])
        loaded = sorted(name for name in sys.modules if name.startswith("sqlalchemy."))
        print(json.dumps({{"status": status, "loaded": loaded}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["status"] == 0
    assert f"sqlalchemy.dialects.{database.dialect}" in report["loaded"]
    others = [f"sqlalchemy.dialects.{name}" for name in DIALECTS if name != database.dialect]
    unneeded = [
        name for name in report["loaded"]
        if any(name == package or name.startswith(f"{package}.")
               for package in (*others, "sqlalchemy.orm"))
    ]
    assert unneeded == []
