"""Run ``sqlqueue`` as a user does: a real process, the URL given one way only, in a directory
of the test's own (so a command that falls back to ``./sqlqueue.db`` leaves it there to see)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testsupport.outbox_app import REPO, sqlqueue_command


def sqlqueue(
    *args: str, cwd: Path, env_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``sqlqueue ARGS`` in *cwd*; ``$SQLQUEUE_URL`` is *env_url* (unset when None)."""
    env = {key: value for key, value in os.environ.items() if key != "SQLQUEUE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if env_url is not None:
        env["SQLQUEUE_URL"] = env_url
    return subprocess.run(
        [*sqlqueue_command(), *args], capture_output=True, text=True, timeout=300, env=env,
        cwd=cwd, check=False,
    )


def shell(
    command: str, *, cwd: Path, env_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run *command* (a hint's, as a user pastes it) in bash, ``sqlqueue`` on the PATH."""
    env = {key: value for key, value in os.environ.items() if key != "SQLQUEUE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if env_url is not None:
        env["SQLQUEUE_URL"] = env_url
    [program, *_] = sqlqueue_command()
    env["PATH"] = os.pathsep.join([str(Path(program).parent), env["PATH"]])
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=300, env=env, cwd=cwd,
        check=False,
    )


def one_line(stderr: str) -> str:
    """The single line of *stderr* (no traceback)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
