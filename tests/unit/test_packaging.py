"""The wheel ships every package of the source tree: pyproject.toml lists them one by one."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
