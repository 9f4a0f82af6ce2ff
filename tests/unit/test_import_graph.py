"""No import cycles in ``sqlqueue_orm`` or ``benchmarks``: every import counts.

The graph is grimp's (the one import-linter checks contracts on), built from every ``import``
statement in the source wherever it stands: at module level, inside a function (a local import
that dodges a cycle at import time is still a cycle between the two modules) and under
``if TYPE_CHECKING:``. Type-only imports are kept: the two modules still cannot be read, checked
or moved apart, and the cycle becomes a run-time one as soon as an annotation is evaluated
(``typing.get_type_hints``, pydantic).

Importing ``a.b.c`` also runs the ``__init__`` of package ``a.b``, so an import counts as one of
each package above the imported module as well, except the importer's own packages (those are
already running when it is imported).

A cycle is reported as a chain, each import with the line it stands on::

    sqlqueue_orm.migration.environment:182 -> sqlqueue_orm.migration.runner:34 -> (back)

One chain is listed for every import that lies on a cycle (the shortest way back to its
importer), so every import to remove is named.
"""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path

import grimp
import pytest

#: The packages whose graph must have no cycle.
PACKAGES = ("sqlqueue_orm", "benchmarks")

#: importer -> imported -> the importer's line numbers of that import.
Edges = dict[str, dict[str, list[int]]]


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:length]) for length in range(1, len(parts))]


def import_graph(*packages: str) -> Edges:
    """Every import between the modules of *packages*, package ``__init__`` runs included."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges: Edges = {module: {} for module in graph.modules}
    for importer in graph.modules:
        own = set(_ancestors(importer))
        for imported in graph.find_modules_directly_imported_by(importer):
            lines = sorted(
                {
                    detail["line_number"]
                    for detail in graph.get_import_details(importer=importer, imported=imported)
                }
            )
            for target in [imported, *_ancestors(imported)]:
                if target in graph.modules and target not in own and target != importer:
                    edges[importer].setdefault(target, [])
                    edges[importer][target] = sorted({*edges[importer][target], *lines})
    return edges


def _path_back(edges: Edges, start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports from *start* to *goal* (breadth first), or None."""
    previous: dict[str, str | None] = {start: None}
    queue = collections.deque([start])
    while queue:
        module = queue.popleft()
        if module == goal:
            path = [module]
            while (before := previous[path[-1]]) is not None:
                path.append(before)
            return path[::-1]
        for imported in sorted(edges.get(module, {})):
            if imported not in previous:
                previous[imported] = module
                queue.append(imported)
    return None


def find_cycles(edges: Edges) -> list[str]:
    """One chain per import lying on a cycle, each rotated to start at its smallest module."""
    seen: set[tuple[str, ...]] = set()
    chains: list[str] = []
    for importer in sorted(edges):
        for imported in sorted(edges[importer]):
            back = _path_back(edges, imported, importer)
            if back is None:
                continue
            cycle = [importer, *back[:-1]]
            first = cycle.index(min(cycle))
            cycle = cycle[first:] + cycle[:first]
            if tuple(cycle) in seen:
                continue
            seen.add(tuple(cycle))
            steps = [
                f"{module}:{','.join(map(str, edges[module][cycle[(i + 1) % len(cycle)]]))}"
                for i, module in enumerate(cycle)
            ]
            chains.append(" -> ".join(steps) + " -> (back)")
    return sorted(chains)


def test_no_import_cycles() -> None:
    chains = find_cycles(import_graph(*PACKAGES))
    assert not chains, f"{len(chains)} import cycle(s):\n" + "\n".join(chains)


# -- the checker itself can fail ----------------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_planted_cycle_through_a_local_import_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(
        tmp_path,
        {
            "planted_cycle/__init__.py": "",
            "planted_cycle/first.py": "from planted_cycle import second\n",
            "planted_cycle/second.py": """\
                def late():
                    from planted_cycle import first  # local: still a cycle

                    return first
                """,
            "planted_cycle/leaf.py": "import planted_cycle.first\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    chains = find_cycles(import_graph("planted_cycle"))

    assert chains == ["planted_cycle.first:1 -> planted_cycle.second:2 -> (back)"]


def test_a_cycle_through_a_package_init_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(
        tmp_path,
        {
            "planted_init/__init__.py": "",
            "planted_init/api/__init__.py": "from planted_init.api import views\n",
            "planted_init/api/views.py": "from planted_init import core\n",
            "planted_init/core.py": "from planted_init.api import helpers\n",
            "planted_init/api/helpers.py": "",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    chains = find_cycles(import_graph("planted_init"))

    assert chains == [
        "planted_init.api:1 -> planted_init.api.views:1 -> planted_init.core:1 -> (back)"
    ]


def test_type_checking_imports_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(
        tmp_path,
        {
            "planted_typing/__init__.py": "",
            "planted_typing/first.py": "import planted_typing.second\n",
            "planted_typing/second.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from planted_typing import first
                """,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert find_cycles(import_graph("planted_typing")) == [
        "planted_typing.first:1 -> planted_typing.second:4 -> (back)"
    ]


def test_an_acyclic_package_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(
        tmp_path,
        {
            "planted_clean/__init__.py": "from planted_clean import top\n",
            "planted_clean/top.py": "from planted_clean import bottom\n",
            "planted_clean/bottom.py": "import os\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert find_cycles(import_graph("planted_clean")) == []
