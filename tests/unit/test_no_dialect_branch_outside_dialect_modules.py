"""No module outside the dialect homes branches on a dialect's name, read from its syntax tree.

Each dialect's run-time statements and facts live in ``sqlqueue_orm/dialects/`` (one
``DialectSupport`` each, found through ``dialects.for_dialect``) and its migration steps in the
migration dialect modules. Everywhere else, a dialect name written as a string and compared,
matched, or used as a dictionary key is a second home for that dialect's behaviour. The checker
parses every module of the package with :mod:`ast` and reports:

* a comparison (``==``, ``!=``, ``in``, ``not in``) with a dialect-name string (alone or in a
  tuple, list or set literal), and a comparison of ``<...>dialect.name`` or of a variable
  ``dialect_name``;
* a ``match`` case with a dialect-name string pattern;
* a dict literal (or ``dict(...)`` call) keyed by dialect names;
* a subscript or ``.get()`` with a dialect-name string key, with ``<...>dialect.name`` as the
  key, or on a name bound in that module to a dict keyed by dialect names;
* a class registering itself by dialect name (``__dialect__ = "sqlite"``): a second registry.

SQLAlchemy's own dialect plumbing is left alone: arguments such as ``with_variant(t, "mssql")``,
``@compiles(X, "mssql")``, ``ddl_if(dialect="sqlite")`` and ``postgresql_where=`` are calls
and keywords, not comparisons or keys.

A second check reads every string constant outside the homes (docstrings and a column's
``server_default=`` aside) for one database's SQL text: its catalog names (``pg_catalog``,
``sys.indexes``), its functions (``encode(``), its casts (``::``) and table hints
(``READPAST``). Such text is a capability field of the dialect (``DialectSupport``).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import textwrap
from collections.abc import Callable

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "sqlqueue_orm"

#: The names of dialects as SQLAlchemy spells them (and PostgreSQL's short one).
DIALECT_NAMES = frozenset({"mssql", "postgresql", "postgres", "sqlite"})

#: Where a dialect's name may be written and branched on: the dialect modules and the
#: per-dialect migration modules (with the registry that picks one of them).
HOMES = (
    "dialects/",
    "migration/tsql/",
    "migration/plpgsql/",
    "migration/sqlite.py",
    "migration/impl.py",
)

_EQUALITIES = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


@dataclasses.dataclass(frozen=True)
class Branch:
    """One place that branches on a dialect's name."""

    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


def _is_dialect_name(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in DIALECT_NAMES


def _holds(node: ast.AST, test: Callable[[ast.AST], bool]) -> bool:
    """*test* holds for *node*, or for an element of it if it is a tuple, list or set literal."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(test(element) for element in node.elts)
    return test(node)


def _is_name_of_a_dialect(node: ast.AST) -> bool:
    """``dialect.name``, ``engine.dialect.name``, ``self.dialect.name``, ..., ``dialect_name``."""
    if isinstance(node, ast.Name):
        return node.id == "dialect_name"
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "dialect") or (
        isinstance(owner, ast.Attribute) and owner.attr == "dialect"
    )


def _keyed_by_dialect_names(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Dict):
        return any(_is_dialect_name(key) for key in node.keys)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return any(keyword.arg in DIALECT_NAMES for keyword in node.keywords)
    return False


def _patterns(pattern: ast.pattern) -> list[ast.pattern]:
    return [node for node in ast.walk(pattern) if isinstance(node, ast.pattern)]


def _dicts_by_dialect_name(tree: ast.AST) -> set[str]:
    """Names bound (anywhere in the module) to a dict literal keyed by dialect names."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _keyed_by_dialect_names(node.value):
            bound |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _keyed_by_dialect_names(node.value)
        ):
            bound.add(node.target.id)
    return bound


def _keyed_lookup(keyed: set[str], container: ast.AST, key: ast.AST | None) -> str | None:
    """Why looking *key* up in *container* picks by a dialect's name (None: it does not).

    :param keyed: the names bound to dicts keyed by dialect names.
    """
    if key is not None and _is_dialect_name(key):
        return f"key {key.value!r}"  # type: ignore[attr-defined]
    if key is not None and _is_name_of_a_dialect(key):
        return "key dialect.name"
    if isinstance(container, ast.Name) and container.id in keyed:
        return f"{container.id}, keyed by dialect names"
    return None


def _comparisons(node: ast.Compare) -> list[str]:
    """What each equality in *node* compares that is a dialect's name, or ``dialect.name``."""
    operands = [node.left, *node.comparators]
    found = []
    for index, operator in enumerate(node.ops):
        if not isinstance(operator, _EQUALITIES):
            continue
        pair = operands[index], operands[index + 1]
        if any(_holds(side, _is_dialect_name) for side in pair):
            found.append("comparison with a dialect name")
        elif any(_holds(side, _is_name_of_a_dialect) for side in pair):
            found.append("comparison of dialect.name")
    return found


def _matches_a_dialect_name(node: ast.match_case) -> bool:
    return any(
        isinstance(pattern, ast.MatchValue) and _is_dialect_name(pattern.value)
        for pattern in _patterns(node.pattern)
    )


def branches_in(source: str, module: str = "<planted>") -> list[Branch]:
    """Every branch on a dialect's name in *source* (see the module docstring)."""
    tree = ast.parse(source)
    keyed = _dicts_by_dialect_name(tree)
    found: list[Branch] = []

    def report(node: ast.AST, what: str) -> None:
        found.append(Branch(module, getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for what in _comparisons(node):
                report(node, what)
        elif isinstance(node, ast.match_case):
            if _matches_a_dialect_name(node):
                report(node.pattern, "match case on a dialect name")
        elif isinstance(node, ast.Dict | ast.Call) and _keyed_by_dialect_names(node):
            report(node, "dict keyed by dialect names")
        elif (
            isinstance(node, ast.Assign)
            and _is_dialect_name(node.value)
            and any(isinstance(target, ast.Name) and target.id == "__dialect__"
                    for target in node.targets)
        ):
            report(node, "registered by dialect name")
        if isinstance(node, ast.Subscript):
            why = _keyed_lookup(keyed, node.value, node.slice)
            if why is not None:
                report(node, f"subscript: {why}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            why = _keyed_lookup(keyed, node.func.value, node.args[0] if node.args else None)
            if why is not None:
                report(node, f".get(): {why}")
    return sorted(found, key=lambda branch: branch.line)


def package_branches() -> list[Branch]:
    """Every branch on a dialect's name in the package, outside :data:`HOMES`."""
    found: list[Branch] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(HOMES):
            continue
        found += branches_in(path.read_text(encoding="utf-8"), relative)
    return found


def test_no_dialect_branch_outside_the_dialect_modules() -> None:
    assert [str(branch) for branch in package_branches()] == []


def _planted(source: str) -> list[str]:
    return [branch.what for branch in branches_in(textwrap.dedent(source))]


def test_the_guard_sees_a_comparison_with_a_dialect_name() -> None:
    assert _planted('if connection.dialect.name == "sqlite":\n    pass') == [
        "comparison with a dialect name"
    ]
    assert _planted("if name != 'mssql':\n    pass") == ["comparison with a dialect name"]
    assert _planted('if dialect.name in ("postgresql", "mssql"):\n    pass') == [
        "comparison with a dialect name"
    ]
    assert _planted('ok = "postgres" not in url') == ["comparison with a dialect name"]
    assert _planted("remote = engine.dialect.name in SERVERS") == ["comparison of dialect.name"]
    assert _planted("ok = step.only_on in (None, dialect_name)") == ["comparison of dialect.name"]
    assert _planted("support = dialects.for_dialect(connection)") == []


def test_the_guard_sees_a_match_case_on_a_dialect_name() -> None:
    source = """
        match engine.dialect.name:
            case "mssql" | "sqlite":
                hint = 1
            case "postgresql":
                hint = 2
            case _:
                hint = 0
    """
    assert _planted(source) == ["match case on a dialect name"] * 2


def test_the_guard_sees_a_dict_keyed_by_dialect_names() -> None:
    source = """
        CLAIM = {"postgresql": "SELECT 1", "mssql": "SELECT 2"}
        OTHER = dict(sqlite="SELECT 3")

        def claim(engine):
            return CLAIM[engine.dialect.name], OTHER.get(name), table.c["sqlite"]
    """
    assert _planted(source) == [
        "dict keyed by dialect names",
        "dict keyed by dialect names",
        "subscript: key dialect.name",
        ".get(): OTHER, keyed by dialect names",
        "subscript: key 'sqlite'",
    ]
    assert _planted('options = index.dialect_options["mssql"]') == ["subscript: key 'mssql'"]
    assert _planted('where = options.get("postgresql")') == [".get(): key 'postgresql'"]


def test_the_guard_sees_a_class_registered_by_dialect_name() -> None:
    source = """
        class _SqliteFence(OffsetFence):
            __dialect__ = "sqlite"
    """
    assert _planted(source) == ["registered by dialect name"]


def test_the_guard_leaves_sqlalchemy_dialect_plumbing_alone() -> None:
    source = """
        HEADERS = sa.Text().with_variant(mssql.NVARCHAR(), "mssql")
        index.ddl_if(dialect=("postgresql", "sqlite"))
        sa.Index("i", column, postgresql_where=column.is_not(None))

        @compiles(CreateIndex, "mssql")
        def _create_index(create, compiler, **kw):
            return statement.with_hint(table, hint, dialect_name=support.name)
    """
    assert _planted(source) == []


def test_the_guard_reads_every_module_of_the_package() -> None:
    modules = [path for path in PACKAGE.rglob("*.py") if "dialects" not in path.parts]
    assert len(modules) > 50
    for path in modules:
        ast.parse(path.read_text(encoding="utf-8"))  # every module parses


#: SQL text and catalog names that belong to one database: its catalog schemas and tables, its
#: functions, its casts, its table hints (case as the database's own SQL writes them).
DATABASE_SPECIFIC_SQL = re.compile(
    r"\bpg_[a-z_]+|\bencode\(|::[a-z\\]|\bsqlite_master\b|\bPRAGMA\b|\bsys\.[a-z_]+|"
    r"\bsp_getapplock\b|\bREADPAST\b|\bUPDLOCK\b|\bNVARCHAR\("
)

def _left_alone(tree: ast.AST) -> set[int]:
    """Docstrings (prose), and a column's ``server_default=`` (table DDL declared per layout)."""
    bodies = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    ids = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, bodies)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "server_default":
            ids.update(id(inner) for inner in ast.walk(node.value))
    return ids


def database_sql_in(package: pathlib.Path) -> list[str]:
    """String constants of *package* holding one database's SQL text, outside :data:`HOMES`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(HOMES):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        left_alone = _left_alone(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in left_alone
                and (match := DATABASE_SPECIFIC_SQL.search(node.value))
            ):
                found.append(f"{relative}:{node.lineno}: {match.group(0)!r}")
    return found


def test_no_database_specific_sql_text_outside_the_dialect_modules() -> None:
    """A database's SQL fragments and catalog names are capability fields of its dialect."""
    assert database_sql_in(PACKAGE) == []


def test_the_sql_guard_sees_a_catalog_name_a_function_and_a_cast(tmp_path) -> None:
    module = tmp_path / "planted.py"
    module.write_text(
        '"""pg_catalog in a docstring is prose."""\n'
        'SYSTEM = ("pg_catalog", "sys")\n'
        "BODY = \"encode(body, 'escape')\"\n"
        'CAST = r"::\\w+"\n'
        'LOCAL = "::1"\n'
        'ID = sa.Column("id", server_default=sa.text("gen_random_uuid()"))\n'
    )
    assert sorted(line.split(": ", 1)[1] for line in database_sql_in(tmp_path)) == sorted(
        ["'pg_catalog'", "'encode('", "'::\\\\'"]
    )
