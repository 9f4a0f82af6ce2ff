"""No module of the package reaches another object's or module's underscore names.

Each part hands its collaborators public, documented methods and attributes (the transport's
``queues``, a pump's ``resize``): an underscore name is its own module's business. The check
parses every module of the package with :mod:`ast` and reports

* an attribute ``X._name`` (read, written or called) where ``X`` is not ``self``, ``cls`` or
  ``super()`` and ``_name`` is no dunder;
* ``from module import _name`` of one of the package's own modules.

``sqlqueue_orm/sqlalchemy_internals.py`` is left out: SQLAlchemy's private names live there on
purpose (``tests/unit/test_sqlalchemy_internals.py`` checks them). The few private names of
other libraries the package needs are listed in :data:`ALLOWED`, each with its reason.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "sqlqueue_orm"

#: The one module allowed to use another library's private names (SQLAlchemy's).
EXEMPT_MODULES = frozenset({"sqlalchemy_internals.py"})

#: Private names of other libraries the package uses, as written, and why.
ALLOWED = {
    "argparse._SubParsersAction": (
        "the type of what ArgumentParser.add_subparsers returns has no public name"
    ),
    "parser._actions": (
        "argparse lists a parser's actions nowhere public; the CLI walks them to accept --url "
        "after every command"
    ),
    "context._jsc": (
        "PySpark reaches the JVM SparkContext (for Hadoop's configuration) only through it"
    ),
    "scope._connection": (
        "the deferred session binds the receive's connection without opening the SAVEPOINT "
        "that MessageScope.connection opens"
    ),
}


def _is_own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: an object reaching its own names."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _offences(source: str, name: str) -> list[str]:
    """Each offence in *source* (module *name*), as ``name:line written``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_own(node.value):
            written = ast.unparse(node)
            if written not in ALLOWED:
                found.append(f"{where} {written}")
        elif (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("sqlqueue_orm")
        ):
            found.extend(
                f"{where} from {node.module} import {alias.name}"
                for alias in node.names
                if _private(alias.name)
            )
    return found


def test_no_module_uses_another_modules_underscore_names() -> None:
    found = [
        offence
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name not in EXEMPT_MODULES
        for offence in _offences(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    ]
    assert found == []


def test_each_allowed_private_name_is_still_used() -> None:
    """An exception no module needs any more is taken off the list."""
    written = {
        ast.unparse(node)
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
    }
    assert set(ALLOWED) - written == set()


def test_the_check_finds_each_kind_of_offence() -> None:
    source = (
        "from sqlqueue_orm.receiving.pump import _resized\n"
        "def f(transport, pump):\n"
        "    transport._address('q')\n"
        "    pump._condition = None\n"
        "    return transport.queues, parser._actions\n"
        "class C:\n"
        "    def g(self):\n"
        "        self._own()\n"
        "        super()._own()\n"
        "        return self.__class__, argparse._SubParsersAction\n"
    )
    offences = sorted(offence.split(" ", 1)[1] for offence in _offences(source, "probe.py"))
    assert offences == [
        "from sqlqueue_orm.receiving.pump import _resized",
        "pump._condition",
        "transport._address",
    ]
