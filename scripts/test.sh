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
echo "== pytest"
exec .venv/bin/python -m pytest "$@"
