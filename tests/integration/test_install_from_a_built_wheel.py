"""The README's install line works on a clean machine: build, check, install, migrate, send.

``python -m build`` makes a wheel and an sdist, ``twine check`` accepts both, and the wheel
installed with ``[postgres]`` into a brand-new virtualenv (no checkout on its path) runs
``sqlqueue migrate`` and a send and receive: the migrations travel inside the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import Database, only

ROOT = Path(__file__).resolve().parents[2]

# Builds the wheel and sdist and installs into a new virtualenv.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert result.returncode == 0, f"{command}: {result.returncode}\n{result.stdout[-2000:]}\n" \
        f"{result.stderr[-3000:]}"
    return result.stdout


@only("postgresql")
def test_the_built_wheel_installs_with_its_extra_and_migrates_and_sends(
    database: Database, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    [wheel] = dist.glob("sqlqueue_orm-*.whl")
    [sdist] = dist.glob("sqlqueue_orm-*.tar.gz")
    _run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)

    clean = tmp_path / "venv"
    venv.create(clean, with_pip=True)
    python = clean / "bin" / "python"
    # outside the checkout, so nothing but the installed wheel can be imported
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    _run(python, "-m", "pip", "install", "-q", f"{wheel}[postgres]", cwd=tmp_path, env=env)
    env["SQLQUEUE_URL"] = database.url
    sqlqueue = clean / "bin" / "sqlqueue"
    _run(sqlqueue, "migrate", cwd=tmp_path, env=env)
    _run(sqlqueue, "create-queue", "billing", cwd=tmp_path, env=env)
    _run(sqlqueue, "send", "billing", "--body", "from the wheel", cwd=tmp_path, env=env)
    script = (
        "import os, sqlqueue_orm\n"
        "assert 'site-packages' in sqlqueue_orm.__file__, sqlqueue_orm.__file__\n"
        "from sqlqueue_orm import Transport\n"
        "with Transport(os.environ['SQLQUEUE_URL']) as transport:\n"
        "    [message] = transport.receive('billing')\n"
        "    print(message.body.decode())\n"
    )
    assert _run(python, "-c", script, cwd=tmp_path, env=env).strip() == "from the wheel"
