"""The endpoint example of docs/endpoint.md runs as written: request/reply on SQLite, PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import only
from testsupport.outbox_app import REPO


def _first_block(language: str) -> str:
    page = (REPO / "docs" / "endpoint.md").read_text()
    section = page.split("### Two endpoints in a conversation", 1)[1].split("\n## ", 1)[0]
    return section.split(f"```{language}\n", 1)[1].split("```\n", 1)[0]


@only("sqlite", "postgresql")
def test_the_documented_endpoint_example_runs_as_written(database, tmp_path):
    code, expected = _first_block("python"), _first_block("text")
    assert code == (REPO / "examples" / "endpoint_example.py").read_text()
    assert expected == (
        "order 42 placed\n"
        "order 7 failed: the item of order 7 is out of stock\n"
        "1 message(s) sent back from error\n"
        "order 7 placed\n"
    )
    script = tmp_path / "example.py"
    script.write_text(code)
    args = [] if database.dialect == "sqlite" else [database.url]
    result = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
