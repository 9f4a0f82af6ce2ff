"""Real-database fixtures: SQLite files, a throwaway PostgreSQL cluster, SQL Server if configured.

* ``database``: parametrized over every available dialect; a brand-new, empty database per test.
* PostgreSQL: ``SQLQUEUE_TEST_POSTGRES_URL`` (a server URL whose user may CREATE DATABASE), else a
  cluster started from the installed binaries. If neither works the tests *fail*: a skipped
  PostgreSQL test is a failed run.
* SQL Server: ``SQLQUEUE_TEST_MSSQL_URL``, else testcontainers when a Docker engine answers;
  otherwise those tests are skipped with the reason shown.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sqlqueue_orm import Transport, db
from testsupport.databases import admin_engine, drop_postgres_database, new_postgres_database

DIALECTS = ("sqlite", "postgresql", "mssql")


@dataclasses.dataclass
class Database:
    """One empty test database."""

    dialect: str
    url: str
    engine: Engine

    def transport(self, **kwargs: object) -> Transport:
        return Transport(self.engine, **kwargs)  # type: ignore[arg-type]


# -- PostgreSQL --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    external = os.environ.get("SQLQUEUE_TEST_POSTGRES_URL")
    if external:
        return external
    from testsupport import pg_cluster

    try:
        cluster = pg_cluster.start()
    except Exception as error:
        pytest.fail(f"PostgreSQL is required and could not be started: {error}")
    return cluster.url()


@pytest.fixture(scope="session")
def postgres_admin(postgres_admin_url: str) -> Iterator[Engine]:
    engine = admin_engine(postgres_admin_url)
    yield engine
    engine.dispose()


# -- SQL Server --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def mssql_admin_url() -> Iterator[str]:
    external = os.environ.get("SQLQUEUE_TEST_MSSQL_URL")
    if external:
        yield external
        return
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception as error:
        pytest.skip(
            "SQL Server tests need SQLQUEUE_TEST_MSSQL_URL or a Docker engine for "
            f"testcontainers; none here ({type(error).__name__})"
        )
    from testcontainers.mssql import SqlServerContainer

    with SqlServerContainer("mcr.microsoft.com/mssql/server:2022-latest") as container:
        yield container.get_connection_url()


def new_mssql_database(admin_url: str) -> str:
    name = f"t_{uuid.uuid4().hex[:16]}"
    engine = admin_engine(admin_url)
    with engine.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE [{name}]")
    engine.dispose()
    return sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_mssql_database(admin_url: str, url: str) -> None:
    name = sa.make_url(url).database
    engine = admin_engine(admin_url)
    with engine.connect() as connection:
        connection.exec_driver_sql(
            f"ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE; "
            f"DROP DATABASE [{name}]"
        )
    engine.dispose()


# -- the parametrized fixture --------------------------------------------------------------
@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(dialect, URL of a brand-new empty database)."""
    dialect = request.param
    if dialect == "sqlite":
        path = tmp_path / "queue.db"
        path.touch()  # an empty file is an empty database; the CLI opens only files that exist
        yield dialect, f"sqlite:///{path}"
    elif dialect == "postgresql":
        admin = request.getfixturevalue("postgres_admin")
        url = new_postgres_database(admin)
        yield dialect, url
        drop_postgres_database(admin, url)
    else:
        admin_url = request.getfixturevalue("mssql_admin_url")
        url = new_mssql_database(admin_url)
        yield dialect, url
        drop_mssql_database(admin_url, url)


@pytest.fixture
def database(database_url: tuple[str, str]) -> Iterator[Database]:
    dialect, url = database_url
    engine = db.create_engine(url)
    yield Database(dialect, url, engine)
    engine.dispose()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "database_url" in metafunc.fixturenames:
        wanted = getattr(metafunc.function, "dialects", DIALECTS)
        metafunc.parametrize("database_url", list(wanted), indirect=True, ids=list(wanted))


_skipped_postgres: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "[postgresql" in report.nodeid:
        _skipped_postgres.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped PostgreSQL test fails the run: PostgreSQL is the real server of every run."""
    if _skipped_postgres:
        print(f"\nFAILED: {len(_skipped_postgres)} PostgreSQL test(s) were skipped, e.g. "
              f"{_skipped_postgres[0]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def only(*dialects: str):  # type: ignore[no-untyped-def]
    """Decorator: run a ``database`` test only on these dialects."""

    def mark(function):  # type: ignore[no-untyped-def]
        function.dialects = dialects
        return function

    return mark


# -- Spark (tests/integration/test_spark*.py) -------------------------------------------------
@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One SparkSession for the whole test session (no UI, 4 shuffle partitions)."""
    from pyspark.sql import SparkSession

    import tests.integration.spark_support  # noqa: F401  (the environment Spark needs)
    from sqlqueue_orm.contrib.spark import streaming

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sqlqueue-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    streaming.register(session)  # the sqlqueue data source
    yield session
    session.stop()
