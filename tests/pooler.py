"""A throwaway PgBouncer in transaction pooling mode in front of a test database.

``with transaction_pooler(url) as pooled_url:`` starts ``pgbouncer`` (Debian's package; as
root through ``runuser -u postgres --``, which it requires) on a free loopback port with
``pool_mode = transaction``, every client logged in as the database URL's user, and stops it
on leaving. psycopg must not prepare statements through it (PgBouncer 1.18 does not carry
them from one server connection to the next): engines for *pooled_url* pass
``prepare_threshold=None``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import sqlalchemy as sa


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def transaction_pooler(url: str) -> Iterator[str]:
    """PgBouncer (transaction pooling) in front of *url*'s database; yields its URL."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        raise RuntimeError("pgbouncer is not installed (scripts/test.sh installs it)")
    target = sa.engine.make_url(url)
    directory = tempfile.mkdtemp(prefix="sqlqueue-pgbouncer-")
    os.chmod(directory, 0o755)
    port = _free_port()
    server = (
        f"host={target.host or '127.0.0.1'} port={target.port or 5432} "
        f"dbname={target.database} user={target.username}"
        + (f" password={target.password}" if target.password else "")
    )
    ini = os.path.join(directory, "pgbouncer.ini")
    with open(ini, "w") as config:
        config.write(
            "[databases]\n"
            f"{target.database} = {server}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            "default_pool_size = 20\nmax_client_conn = 100\n"
            f"logfile = {directory}/pgbouncer.log\n"
        )
    os.chmod(ini, 0o644)
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    runner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    process = subprocess.Popen([*runner, binary, ini], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    pooled = target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start: {process.communicate()[1]}"
                                       ) from None
                time.sleep(0.05)
        yield pooled
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
