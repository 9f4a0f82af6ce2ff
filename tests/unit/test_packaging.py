"""The wheel ships every package of the source tree: pyproject.toml lists them one by one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: name, optional extras, floor, optional upper bound
_REQUIREMENT = re.compile(r"([A-Za-z0-9_\-]+)(?:\[[^\]]*\])?>=([0-9.]+)(?:,<[0-9.]+)?")


def test_every_package_of_the_source_tree_is_listed_for_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    found = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "sqlqueue_orm").rglob("__init__.py")
    }
    listed = set(setuptools["packages"])
    assert found - listed == set()
    assert "sqlqueue_orm.migrations_versions" in listed


def test_the_lowest_versions_ci_runs_are_the_floors_pyproject_admits() -> None:
    """scripts/lowest-versions.txt pins each dependency at its pyproject floor, no higher."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["postgres"]]
    floors = {}
    for requirement in requirements:
        match = _REQUIREMENT.fullmatch(requirement)
        assert match, f"{requirement!r}: a floor (>=) is expected"
        floors[match[1].lower()] = match[2]
    pinned = dict(
        line.split("==")
        for line in (ROOT / "scripts" / "lowest-versions.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    for name, floor in floors.items():
        assert name in pinned, f"{name} is not pinned in scripts/lowest-versions.txt"
        assert [int(part) for part in pinned[name].split(".")][: floor.count(".") + 1] == [
            int(part) for part in floor.split(".")
        ], f"{name}: pinned {pinned[name]}, floor {floor}"
