"""Benchmarks, scripts and their support package import nothing from the tests package.

What they share with the tests (the throwaway PostgreSQL cluster, its databases, the browser,
the outbox application, the earlier releases' tables) lives in ``testsupport``, which both use:
a benchmark that imported ``tests`` would run the tests' conftest machinery, and a change to a
test could break a measurement.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("benchmarks", "scripts", "testsupport")


def imports_of_tests(source: str) -> list[tuple[int, str]]:
    """Each import in *source* of the ``tests`` package or a module in it: (line, module)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] == "tests"]
    return found


def test_the_check_finds_an_import_of_tests() -> None:
    planted = (
        "import os\nfrom tests import pg_cluster\nimport tests.conftest\n"
        "from testsupport import x\n"
    )
    assert imports_of_tests(planted) == [(2, "tests"), (3, "tests.conftest")]


def test_benchmarks_scripts_and_testsupport_import_nothing_from_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, module in imports_of_tests(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
