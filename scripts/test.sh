#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian/Ubuntu machine, then run it all:
# lint (ruff), types (mypy --strict), and pytest on SQLite, a throwaway PostgreSQL cluster and
# (when configured) SQL Server. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

missing=()
have_postgres() {
  [ -n "${SQLQUEUE_TEST_POSTGRES_URL:-}" ] && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 0
  command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]
}
have_postgres || missing+=(postgresql)
# The flow-control tests run a batched pump through PgBouncer's transaction pooling.
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
# pyodbc needs unixODBC's libodbc; FreeTDS is the ODBC driver Debian ships for SQL Server.
ldconfig -p 2>/dev/null | grep -q 'libodbc\.so\.2' || missing+=(unixodbc)
dpkg -s tdsodbc >/dev/null 2>&1 || missing+=(tdsodbc)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
# The dashboard's browser tests: Debian's headless Chromium and its driver (nothing downloaded).
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing system packages: ${missing[*]}"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev,postgres,mssql,spark]"

echo "== ruff";  .venv/bin/ruff check .
echo "== mypy --strict"; .venv/bin/mypy
echo "== lint-imports"; .venv/bin/lint-imports

# The core of the suite once more with the lowest versions pyproject.toml admits (SQLAlchemy,
# Alembic, pydantic, psycopg, orjson), so the floors it claims are the floors it runs on.
[ -x .venv-lowest/bin/python ] || python3 -m venv .venv-lowest
.venv-lowest/bin/python -m pip install -q --upgrade pip
.venv-lowest/bin/python -m pip install -q -c scripts/lowest-versions.txt -e ".[dev,postgres]"
echo "== pytest, lowest supported versions: $(.venv-lowest/bin/python -c 'import sqlalchemy, alembic, pydantic, psycopg; print("SQLAlchemy", sqlalchemy.__version__, "Alembic", alembic.__version__, "pydantic", pydantic.__version__, "psycopg", psycopg.__version__)')"
.venv-lowest/bin/python -m pytest -q -p no:cacheprovider \
  tests/unit/test_headers.py tests/unit/test_messages.py tests/unit/test_addressing.py \
  tests/unit/test_transport_errors.py tests/unit/test_sqlalchemy_internals.py \
  tests/integration/test_fifo_order.py tests/integration/test_rollback.py \
  tests/integration/test_unit_of_work.py tests/integration/test_outbox.py \
  tests/integration/test_dispatcher.py tests/integration/test_transport_begin.py \
  tests/integration/test_single_statement_autocommit.py \
  tests/integration/test_observed_statements.py tests/integration/test_wire_format.py \
  tests/integration/test_one_exception_family.py \
  tests/integration/test_endpoint_transaction_modes.py \
  tests/migration/test_migrations_keep_messages.py

echo "== pytest"
exec .venv/bin/python -m pytest "$@"
