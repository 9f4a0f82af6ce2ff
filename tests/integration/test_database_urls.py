"""PostgreSQL URLs as users paste them, and a missing driver that says what to install.

``postgres://`` (Heroku, libpq's own scheme) and ``postgresql://`` without a driver both reach
the driver the ``postgres`` extra installs, psycopg, from Python and from the command line.
Without psycopg, the error names the extra instead of only "No module named 'psycopg'". Every
connection bounds its waits on the network, unless the URL says otherwise.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa

from sqlqueue_orm import ConfigurationError, OutgoingMessage, Transport, db
from tests.conftest import only
from tests.integration.test_cli import one_line, sqlqueue

EXTRA_HINT = 'pip install "sqlqueue_orm[postgres]"'


def _as_pasted(url: str, scheme: str) -> str:
    """*url* with its scheme written *scheme* (no driver), password kept."""
    return sa.make_url(url).set(drivername=scheme).render_as_string(hide_password=False)


@only("postgresql")
@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_a_transport_accepts_the_url_as_pasted(database, scheme):
    with Transport(_as_pasted(database.url, scheme)) as transport:
        assert transport.engine.dialect.driver == "psycopg"
        transport.create_queue("pasted")
        transport.send("pasted", OutgoingMessage(b"hello"))
        assert [m.body for m in transport.receive("pasted")] == [b"hello"]


@only("postgresql")
@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_the_command_line_accepts_the_url_as_pasted(database, scheme):
    url = _as_pasted(database.url, scheme)
    assert sqlqueue(url, "create-queue", "pasted").returncode == 0
    assert sqlqueue(url, "send", "pasted", "--body", "hi").returncode == 0
    assert sqlqueue(url, "peek", "pasted").stdout.strip() == "1"


def _without_psycopg(code: str) -> subprocess.CompletedProcess[str]:
    """Run *code* in a Python where ``import psycopg`` fails as it does when not installed."""
    prelude = "import sys; sys.modules['psycopg'] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("url", ["postgresql+psycopg://app@db.invalid/shop",
                                 "postgres://app@db.invalid/shop"])
def test_a_missing_driver_names_the_extra_to_install(url):
    done = _without_psycopg(
        "from sqlqueue_orm import Transport, ConfigurationError\n"
        "try:\n"
        f"    Transport({url!r})\n"
        "except ConfigurationError as error:\n"
        "    print(error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert EXTRA_HINT in done.stdout and "psycopg" in done.stdout, done.stdout
    cli = _without_psycopg(
        "from sqlqueue_orm import cli\n"
        f"raise SystemExit(cli.main(['--url', {url!r}, 'peek', 'orders']))\n"
    )
    assert cli.returncode == 2, cli
    line = one_line(cli.stderr)
    assert EXTRA_HINT in line, line


def test_an_unknown_scheme_still_says_what_it_is():
    with pytest.raises(ConfigurationError, match="nosuchdb"):
        Transport("nosuchdb://app@db.invalid/shop")


def test_an_offline_migration_script_accepts_the_url_as_pasted():
    """``migrate --sql`` with a range needs no connection, only the dialect the URL names."""
    done = sqlqueue("postgres://app@db.invalid/shop", "migrate", "--sql", "--revision",
                    "base:head", check=False)
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE" in done.stdout and "sqlqueue_alembic_version" in done.stdout


@only("postgresql")
def test_the_connections_of_an_engine_carry_the_bounds_and_the_urls_own(database):
    url = sa.make_url(database.url).update_query_dict({"keepalives_idle": "30"})
    engine = db.create_engine(url)
    try:
        with engine.connect() as connection:
            dsn = connection.connection.driver_connection.info.dsn  # type: ignore[union-attr]
    finally:
        engine.dispose()
    parameters = dict(part.split("=", 1) for part in dsn.split())
    assert parameters["tcp_user_timeout"] == "10000"
    assert parameters["keepalives"] == "1"
    assert parameters["connect_timeout"] == "5"
    assert parameters["keepalives_idle"] == "30"  # the URL's own
