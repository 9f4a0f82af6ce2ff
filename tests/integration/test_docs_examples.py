"""Every shell and Python block of README.md and docs/ runs as written (tests/docs_blocks.py).

Each page runs once per database its blocks name: SQLite in a temporary directory, PostgreSQL on
a brand-new database of the suite's cluster. A block that cannot run says why in its marker;
those reasons are printed here (``pytest -s`` or ``-rA`` shows them).
"""

from __future__ import annotations

import pytest

from tests import docs_blocks
from testsupport.databases import drop_postgres_database, new_postgres_database


def _ids(pages):  # type: ignore[no-untyped-def]
    return [str(page.relative_to(docs_blocks.REPO)) for page in pages]


SQLITE_PAGES = docs_blocks.pages_with_runs("sqlite")
POSTGRES_PAGES = docs_blocks.pages_with_runs("postgresql")


@pytest.mark.parametrize("page", SQLITE_PAGES, ids=_ids(SQLITE_PAGES))
@pytest.mark.timeout(480)  # every block of a page: the long pages take a minute
def test_the_blocks_of_a_page_run_on_sqlite(page, tmp_path):
    for reason in docs_blocks.run_page(page, "sqlite", tmp_path, None):
        print("not run:", reason)


@pytest.mark.parametrize("page", POSTGRES_PAGES, ids=_ids(POSTGRES_PAGES))
@pytest.mark.timeout(480)
def test_the_blocks_of_a_page_run_on_postgresql(page, tmp_path, postgres_admin):
    url = new_postgres_database(postgres_admin)
    try:
        for reason in docs_blocks.run_page(page, "postgresql", tmp_path, url):
            print("not run:", reason)
    finally:
        drop_postgres_database(postgres_admin, url)


def test_every_block_runs_or_says_why_not():
    shown = docs_blocks.RUN_LANGUAGES + docs_blocks.SHOWN_LANGUAGES
    not_run = []
    for block in docs_blocks.every_block():
        assert block.language in shown, f"{block.where}: a block in {block.language!r}"
        assert block.database in ("sqlite", "postgresql"), f"{block.where}: {block.database}"
        if block.not_run is not None:
            assert block.not_run.strip(), f"{block.where}: 'not run' names no reason"
            not_run.append(f"{block.where}: {block.not_run}")
        if block.output:
            assert block.language == "text", f"{block.where}: output must be a text block"
        if block.file:
            assert block.language == "python", f"{block.where}: only Python blocks are files"
    print("\n".join(["blocks not run:", *not_run]))
