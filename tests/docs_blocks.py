"""The fenced blocks of README.md and docs/*.md, and what runs them (tests/*/test_docs*.py).

A page's blocks run in document order, as a reader would type them: the Python blocks of a page
in one interpreter (one namespace, so a block may use what an earlier one defined), the shell
blocks in bash with ``sqlqueue`` and ``python`` on the PATH, all in one working directory per
page and database, sharing the environment a shell block exports.

HTML comments right before a block (invisible on GitHub) say how it runs:

``<!-- not run: REASON -->``      the block is not run; REASON says why (reported by the tests)
``<!-- database: postgresql -->`` this and the page's later blocks run against a brand-new
                                  PostgreSQL database, whose URL replaces ``EXAMPLE_POSTGRES_URL``
                                  in them (``sqlite``, the default, switches back)
``<!-- file: NAME -->``           the block is written to NAME in the working directory (a module
                                  a later block imports or ``sqlqueue run`` loads), not executed
``<!-- output -->``               before a ``text`` block: what the run block before it prints
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: The pages whose blocks are run.
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
#: The PostgreSQL URL the pages show; a test's own database replaces it.
EXAMPLE_POSTGRES_URL = "postgresql+psycopg://app@db/shop"
RUN_LANGUAGES = ("python", "sh")
#: Languages shown, never run (output, SQL, configuration files, HTTP).
SHOWN_LANGUAGES = ("text", "sql", "ini", "toml", "json")

_MARKER = re.compile(r"<!--\s*(not run|database|file|output)\s*(?::\s*(.*?))?\s*-->")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a page, with what its markers say."""

    page: Path
    line: int
    language: str
    text: str
    database: str = "sqlite"
    not_run: str | None = None
    file: str | None = None
    output: bool = False

    @property
    def where(self) -> str:
        """``docs/endpoint.md:42``: the page and line of the opening fence."""
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether a test runs (or writes) this block."""
        return self.language in RUN_LANGUAGES and self.not_run is None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of *page*, in order, with its markers applied."""
    found: list[Block] = []
    database = "sqlite"
    pending: dict[str, str] = {}
    fence: str | None = None
    body: list[str] = []
    start = 0
    language = ""
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if fence is None:
            marker = _MARKER.search(line)
            if marker:
                kind, value = marker.group(1), (marker.group(2) or "").strip()
                if kind == "database":
                    database = value
                else:
                    pending[kind] = value
                continue
            stripped = line.lstrip()
            if stripped.startswith("```"):
                fence = line[: len(line) - len(stripped)] + "```"
                language, start, body = stripped[3:].strip(), number, []
            elif stripped:
                pending.clear()
            continue
        if line.strip() == "```":
            indent = len(fence) - 3
            text = textwrap.dedent("\n".join(body)) + "\n" if body else ""
            if indent:
                text = "".join(part[indent:] if part.startswith(" " * indent) else part
                               for part in text.splitlines(keepends=True))
            found.append(Block(page, start, language, text, database,
                               not_run=pending.get("not run"), file=pending.get("file"),
                               output="output" in pending))
            pending.clear()
            fence = None
        else:
            body.append(line)
    return found


def every_block() -> Iterator[Block]:
    """The blocks of every page."""
    for page in PAGES:
        yield from blocks(page)


def pages_with_runs(database: str) -> list[Path]:
    """The pages having at least one block that runs against *database*."""
    return [page for page in PAGES
            if any(b.runs and b.database == database for b in blocks(page))]


# -- running a page -----------------------------------------------------------------------------
class Session:
    """One page's blocks against one database: a working directory, a Python, a shell."""

    def __init__(self, directory: Path, url: str | None) -> None:
        self.directory = directory
        self.url = url
        bin_dir = directory / ".bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name, command in (("sqlqueue", f'"{sys.executable}" -m sqlqueue_orm.cli "$@"'),
                              ("python", f'"{sys.executable}" "$@"')):
            script = bin_dir / name
            script.write_text(f"#!/bin/sh\nexec {command}\n")
            script.chmod(0o755)
        self.env = {**os.environ,
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": f"{REPO}{os.pathsep}{directory}",
                    "PYTHONUNBUFFERED": "1"}
        self.env.pop("SQLQUEUE_URL", None)
        self._python: subprocess.Popen[str] | None = None
        self._answers: queue.Queue[str] = queue.Queue()

    def _text(self, block: Block) -> str:
        if self.url is not None:
            return block.text.replace(EXAMPLE_POSTGRES_URL, self.url)
        return block.text

    def run(self, block: Block, timeout: float = 180.0) -> str:
        """Run (or write) *block*; return what it printed. Raises AssertionError on failure."""
        if block.file:
            (self.directory / block.file).write_text(self._text(block), encoding="utf-8")
            return ""
        if block.language == "sh":
            return self._shell(block, timeout)
        return self._run_python(block, timeout)

    def _shell(self, block: Block, timeout: float) -> str:
        dump = self.directory / ".env-after"
        script = f"{self._text(block)}\nenv -0 > '{dump}'\n"
        result = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=self.directory,
                                env=self.env, capture_output=True, text=True, timeout=timeout,
                                check=False)
        assert result.returncode == 0, (
            f"{block.where}: exit status {result.returncode}\n{block.text}\n"
            f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
        self.env = dict(item.split("=", 1) for item in
                        dump.read_text().split("\0") if "=" in item)
        return result.stdout

    def _run_python(self, block: Block, timeout: float) -> str:
        if self._python is None:
            with (self.directory / ".stderr").open("w") as stderr:
                self._python = subprocess.Popen(
                    [sys.executable, "-c", "from tests.docs_blocks import serve; serve()"],
                    cwd=self.directory, env=self.env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
            threading.Thread(target=self._read, args=(self._python,), daemon=True).start()
        assert self._python.stdin is not None
        request = {"code": self._text(block), "name": block.where, "env": self.env}
        self._python.stdin.write(json.dumps(request) + "\n")
        self._python.stdin.flush()
        try:
            answer = json.loads(self._answers.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"{block.where}: still running after {timeout} s\n"
                                 f"{self._stderr()}") from None
        assert answer["error"] is None, (
            f"{block.where}:\n{block.text}\n{answer['error']}\n{self._stderr()}")
        return str(answer["stdout"])

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("\x1e"):
                self._answers.put(line[1:])
        self._answers.put(json.dumps({"error": "the interpreter ended", "stdout": ""}))

    def _stderr(self) -> str:
        path = self.directory / ".stderr"
        return "stderr:\n" + path.read_text()[-3000:] if path.exists() else ""

    def close(self) -> None:
        """End the page's Python (its endpoints' threads with it)."""
        if self._python is not None:
            assert self._python.stdin is not None
            self._python.stdin.close()
            try:
                self._python.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._python.kill()


class _Captured(io.TextIOBase):
    """sys.stdout of the page's interpreter: what every thread prints, kept until asked."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:  # type: ignore[override]
        with self._lock:
            self._parts.append(text)
        return len(text)

    def take(self) -> str:
        with self._lock:
            text, self._parts = "".join(self._parts), []
        return text


def serve() -> None:
    """The page's interpreter: run each block sent on stdin in one namespace, answer on stdout."""
    answers = sys.stdout
    captured = _Captured()
    sys.stdout = captured
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")  # the page's blocks run as a script's module does
    sys.modules["__main__"] = main
    namespace: dict[str, Any] = main.__dict__
    for line in sys.stdin:
        request = json.loads(line)
        os.environ.clear()
        os.environ.update(request["env"])
        error = None
        try:
            exec(compile(request["code"], request["name"], "exec"), namespace)
        except BaseException:  # a block's SystemExit is a failure too
            error = traceback.format_exc()
        sys.stdout.flush()
        answers.write("\x1e" + json.dumps({"error": error, "stdout": captured.take()}) + "\n")
        answers.flush()
    answers.flush()
    os._exit(0)  # endpoints a page left running end with it


def run_page(page: Path, database: str, directory: Path, url: str | None) -> list[str]:
    """Run every block of *page* for *database*; return the blocks not run, with their reasons."""
    session = Session(directory, url)
    not_run: list[str] = []
    last = ""
    try:
        for block in blocks(page):
            if block.database != database:
                continue
            if block.not_run is not None:
                if block.language in RUN_LANGUAGES:
                    not_run.append(f"{block.where}: {block.not_run}")
                continue
            if block.output:
                assert last == block.text, (
                    f"{block.where}: printed\n{last}\ninstead of\n{block.text}")
                continue
            if block.runs:
                last = session.run(block)
    finally:
        session.close()
    return not_run
