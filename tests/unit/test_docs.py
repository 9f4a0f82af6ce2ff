"""The README and docs/: their shape, their links, the guarantees index, the headline figures."""

from __future__ import annotations

import builtins
import json
import re
import symtable

import pytest

from benchmarks import headline
from tests import docs_blocks

REPO = docs_blocks.REPO
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
FOUR_PARTS = ("## What you can rely on", "## How to use it", "## Settings", "## Limits")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of the headings of a page."""
    anchors = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_the_readme_starts_with_its_title_one_sentence_and_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) < 300
    title, sentence, commands = text.split("\n\n", 3)[:3]
    assert title == "# sqlqueue_orm"
    assert sentence.startswith("sqlqueue_orm ") and sentence.endswith(".")
    assert ". " not in sentence.replace("\n", " "), "one sentence"
    marker, block = commands.split("\n", 1)
    assert marker.startswith("<!-- not run: ") and marker.endswith("-->")
    assert block == (
        "```sh\n"
        "python3 -m venv .venv && .venv/bin/pip install -q -e . && "
        ".venv/bin/python -m sqlqueue_orm.demo\n"
        "bash scripts/test.sh\n"
        "```"
    )


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_page_has_the_four_parts_in_order(page):
    text = page.read_text()
    positions = [text.find(f"\n{part}\n") for part in FOUR_PARTS]
    assert all(position >= 0 for position in positions), (page.name, positions)
    assert positions == sorted(positions), page.name


@pytest.mark.parametrize("page", [README, *PAGES], ids=["README.md", *[p.name for p in PAGES]])
def test_no_words_of_how_the_work_was_organised(page):
    text = page.read_text()
    assert not re.search(r"stop [0-9]|issue [0-9]", text, re.IGNORECASE)


@pytest.mark.parametrize("page", [README, *PAGES], ids=["README.md", *[p.name for p in PAGES]])
def test_pages_read_as_a_manual_not_a_log_of_runs(page):
    """No first person, no run durations that drift, no figures of a run: those are history."""
    text = page.read_text()
    if "<!-- headline:start -->" in text:  # the generated headline table is a run's figures
        head, rest = text.split("<!-- headline:start -->", 1)
        text = head + rest.split("<!-- headline:end -->", 1)[1]
    for pattern in (r"\bwe\b", r"\bthe runs\b", r"\b(about|takes|took) \d+ (minutes|seconds|s)\b"):
        found = re.search(pattern, text, re.IGNORECASE)
        assert found is None, f"{page.name}: {text[max(found.start() - 40, 0):found.end() + 40]!r}"


def test_the_history_of_runs_speaks_of_the_product_only():
    text = (REPO / "benchmarks" / "results" / "history.md").read_text()
    assert not re.search(r"stop [0-9]|issue [0-9]|\bstop's\b|engineer", text, re.IGNORECASE)


@pytest.mark.parametrize("page", [README, *PAGES], ids=["README.md", *[p.name for p in PAGES]])
def test_every_relative_link_resolves(page):
    for target in _LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved.read_text()), f"{page.name}: {target}"


#: A link of the guarantees index to a test: ``[<path under tests/>::<function>](<the file>)``.
_TEST_LINK = re.compile(r"\[`?([^\]`]+?)::(test_\w+)`?\]\((\.\./tests/[^)\s]+)\)")


def test_the_guarantees_index_names_only_tests_that_exist():
    text = (REPO / "docs" / "guarantees.md").read_text()
    tests = [target for target in _LINK.findall(text) if target.startswith("../tests/")]
    assert len(tests) > 50
    for target in tests:
        path = (REPO / "docs" / target).resolve()
        assert path.is_file(), f"the guarantees index names {target}, which does not exist"
        assert path.name.startswith("test_"), target


def test_each_row_of_the_guarantees_index_names_test_functions_that_exist():
    text = (REPO / "docs" / "guarantees.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "../tests/" in line]
    assert len(rows) > 50
    for row in rows:
        named = _TEST_LINK.findall(row)
        assert len(named) == row.count("](../tests/"), f"a test link names no function: {row}"
        for shown, function, target in named:
            path = (REPO / "docs" / target).resolve()
            assert target.endswith(shown), (shown, target)
            source = path.read_text()
            assert re.search(rf"^\s*(async )?def {function}\(", source, re.M), (target, function)


def test_the_guarantees_index_covers_every_page():
    text = (REPO / "docs" / "guarantees.md").read_text()
    anchors = _anchors(text)
    for page in PAGES:
        for target in _LINK.findall(page.read_text()):
            if target.startswith("guarantees.md#"):
                assert target.split("#", 1)[1] in anchors, (page.name, target)


def test_the_readme_figures_are_the_latest_runs():
    text = README.read_text()
    shown = text.split("<!-- headline:start -->\n", 1)[1].split("<!-- headline:end -->", 1)[0]
    latest = json.loads((REPO / "benchmarks" / "results" / "latest.json").read_text())
    assert shown == headline.headline(latest), "run: python -m benchmarks.headline"


def test_markers_say_how_a_block_runs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: needs SQL Server -->\n```sh\nsqlqueue ddl\n```\n\n"
        "<!-- database: postgresql -->\n<!-- file: app.py -->\n```python\nx = 1\n```\n\n"
        "```python\nprint(x)\n```\n\n<!-- output -->\n```text\n1\n```\n\n"
        "Text between.\n\n```sh\nsqlqueue peek q\n```\n"
    )
    found = docs_blocks.blocks(page)
    assert [(b.language, b.database) for b in found] == [
        ("sh", "sqlite"), ("python", "postgresql"), ("python", "postgresql"),
        ("text", "postgresql"), ("sh", "postgresql")]
    assert found[0].not_run == "needs SQL Server" and not found[0].runs
    assert found[1].file == "app.py" and found[2].file is None
    assert found[3].output and not found[4].output and found[4].not_run is None


def _unbound_names(code: str, name: str) -> set[str]:
    """Names *code* reads at module level, or as globals inside its functions, but never binds."""
    table = symtable.symtable(code, name, "exec")
    bound = {symbol.get_name() for symbol in table.get_symbols()
             if symbol.is_assigned() or symbol.is_imported()}
    read: set[str] = set()
    tables = [table]
    while tables:
        current = tables.pop()
        tables.extend(current.get_children())
        read |= {symbol.get_name() for symbol in current.get_symbols()
                 if symbol.is_referenced() and (current is table or symbol.is_global())}
    return read - bound - set(dir(builtins))


def test_each_python_block_of_the_readme_runs_on_its_own():
    """A reader copies one block of the tour: it imports and defines everything it uses."""
    leaning = {
        block.where: sorted(_unbound_names(block.text, block.where))
        for block in docs_blocks.blocks(README)
        if block.language == "python" and block.file is None
    }
    assert {where: names for where, names in leaning.items() if names} == {}


def test_the_readme_s_python_blocks_read_the_database_url_from_the_environment():
    """The shell steps export SQLQUEUE_URL; the Python blocks use it, not a URL of their own."""
    hard_coded = [block.where for block in docs_blocks.blocks(README)
                  if block.language == "python" and "://" in block.text]
    assert hard_coded == []
