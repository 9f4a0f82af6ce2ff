"""The package reads no environment variable meant for its tests.

A test that needs the product to misbehave (die at a step, as a crash would) injects that itself,
in the process it runs, through a parameter or a hook the product calls (``ingesting.on_step``):
a variable the product reads would let any environment that sets it crash a production run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sqlqueue_orm"
#: An environment variable's name meant for tests: TEST as a word of an upper-case name.
TEST_VARIABLE = re.compile(r"^[A-Z0-9_]*\bTEST(_[A-Z0-9_]*)?$|^[A-Z0-9_]*_TEST(_[A-Z0-9_]*)?$")


def variables_for_tests_in(source: str) -> list[tuple[int, str]]:
    """Each string constant in *source* that names a test's environment variable."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and TEST_VARIABLE.match(node.value)
    ]


def test_the_check_finds_a_test_variable() -> None:
    planted = 'KILL = "SQLQUEUE_SPARK_TEST_KILL_AT"\nURL = "SQLQUEUE_URL"\nTEXT = "a TEST"\n'
    assert variables_for_tests_in(planted) == [(1, "SQLQUEUE_SPARK_TEST_KILL_AT")]


def test_no_module_of_the_package_names_a_test_variable() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in variables_for_tests_in(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
