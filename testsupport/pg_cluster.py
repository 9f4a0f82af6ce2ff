"""A throwaway PostgreSQL cluster built from the installed binaries, for tests and benchmarks.

``initdb`` refuses to run as root, so as root every server command runs through
``runuser -u postgres --``. The cluster lives in a temporary directory, listens on a free port on
127.0.0.1 only, runs with fsync off (it is thrown away), and is stopped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

#: The one role of the throwaway cluster that logs in with a password (scram-sha-256).
PASSWORD_ROLE = "sqlqueue_password_user"


def _bindir() -> str:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        bindir = out.stdout.strip()
        if out.returncode == 0 and os.path.exists(os.path.join(bindir, "initdb")):
            return bindir
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return os.path.dirname(candidates[0])
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(os.path.realpath(initdb))
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) are not installed: "
        "apt-get install postgresql, or set SQLQUEUE_TEST_POSTGRES_URL"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """A running throwaway cluster; ``url(db)`` gives a SQLAlchemy URL for database *db*."""

    directory: str
    port: int
    bindir: str
    user: str = "postgres"

    def url(self, database: str = "postgres", user: str | None = None, password: str = "") -> str:
        auth = user or self.user
        if password:
            auth += f":{password}"
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        _run(
            self.bindir,
            "pg_ctl",
            "-D",
            os.path.join(self.directory, "data"),
            "-m",
            "immediate",
            "stop",
            check=False,
        )
        shutil.rmtree(self.directory, ignore_errors=True)


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _run(
    bindir: str, tool: str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [*_as_postgres(), os.path.join(bindir, tool), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stdout}\n{result.stderr}")
    return result


def start(durable: bool = False) -> Cluster:
    """Create and start a cluster; it is stopped and removed when the process exits.

    :param durable: keep PostgreSQL's defaults ``fsync``, ``synchronous_commit`` and
        ``full_page_writes`` on (each commit waits for its WAL flush), for a benchmark that
        must count them; off by default (the cluster is thrown away).
    """
    bindir = _bindir()
    directory = tempfile.mkdtemp(prefix="sqlqueue-pg-")
    os.chmod(directory, 0o755)
    data = os.path.join(directory, "data")
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    _run(
        bindir,
        "initdb",
        "-D",
        data,
        "-U",
        user,
        "--auth=trust",
        "-E",
        "UTF8",
        "--locale=C.UTF-8" if _has_locale("C.UTF-8") else "--locale=C",
    )
    # Every login is trusted but one: PASSWORD_ROLE must give its password, so a test can meet
    # the server refusing a wrong one.
    hba = os.path.join(data, "pg_hba.conf")
    with open(hba, encoding="utf-8") as file:
        rules = file.read()
    with open(hba, "w", encoding="utf-8") as file:
        file.write(f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n{rules}")
    port = _free_port()
    options = (
        f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={directory} "
        "-c max_connections=200 -c shared_buffers=256MB"
    )
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    _run(
        bindir,
        "pg_ctl",
        "-D",
        data,
        "-o",
        options,
        "-l",
        os.path.join(directory, "log"),
        "-w",
        "-t",
        "60",
        "start",
    )
    cluster = Cluster(directory, port, bindir, user)
    atexit.register(cluster.stop)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return cluster
        time.sleep(0.1)
    raise RuntimeError(f"PostgreSQL did not start on port {port}")


def _has_locale(name: str) -> bool:
    result = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False)
    wanted = name.lower().replace("-", "")
    return any(line.lower().replace("-", "") == wanted for line in result.stdout.splitlines())
