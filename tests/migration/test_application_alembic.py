"""The library inside an application's own Alembic history, both ways the docs describe.

Each test makes a real application layout with ``alembic init`` in a temporary folder (its own
model, its own ``env.py`` with the one line docs/migrations.md gives) and drives it with the
``alembic`` command in a subprocess, as the application's developers would:

* beside it: the library's tables under ``sqlqueue migrate`` with their own version table;
* inside it: the library's revisions as the ``sqlqueue_orm`` branch of the application's
  history (``version_locations``, ``alembic upgrade heads``), and the move from the first way
  to the second and back.

Either way ``alembic check`` finds nothing to do once the library's tables, two queues and a
delayed table exist, and still finds a change to the application's own model.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from sqlqueue_orm import cli
from sqlqueue_orm.migration import configuration, environment
from tests.conftest import Database

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = Path(sys.executable).parent / "alembic"

MODEL = """\
import sqlalchemy as sa

metadata = sa.MetaData()
customers = sa.Table(
    "customers",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(50)),
{extra})
"""


@dataclasses.dataclass
class Application:
    """An application folder made by ``alembic init``, with its model and ``env.py`` line."""

    folder: Path

    @classmethod
    def init(cls, folder: Path, url: str) -> Application:
        app = cls(folder)
        app.alembic("init", "migrations")
        app.model()
        ini = app.ini.read_text()
        ini = ini.replace(
            "sqlalchemy.url = driver://user:pass@localhost/dbname",
            "sqlalchemy.url = " + url.replace("%", "%%"),
        )
        app.ini.write_text(ini)
        env = (folder / "migrations" / "env.py").read_text()
        env = env.replace(
            "target_metadata = None",
            "import sqlqueue_orm\nfrom app_models import metadata as target_metadata",
        )
        # The documented line, in both configure() calls of the generated env.py.
        env = env.replace(
            "target_metadata=target_metadata",
            "target_metadata=target_metadata, include_object=sqlqueue_orm.alembic_filter",
        )
        (folder / "migrations" / "env.py").write_text(env)
        return app

    @property
    def ini(self) -> Path:
        return self.folder / "alembic.ini"

    def model(self, extra: str = "") -> None:
        (self.folder / "app_models.py").write_text(MODEL.format(extra=extra))

    def include_library_revisions(self) -> None:
        """The ``alembic.ini`` lines of docs/migrations.md for one history."""
        ini = self.ini.read_text()
        ini = ini.replace("path_separator = os", "path_separator = newline")
        ini = ini.replace(
            "# version_locations = %(here)s/bar:%(here)s/bat:%(here)s/alembic/versions",
            "version_locations =\n"
            "    %(here)s/migrations/versions\n"
            "    sqlqueue_orm.migrations_versions:.",
        )
        assert "sqlqueue_orm.migrations_versions" in ini
        self.ini.write_text(ini)

    def exclude_library_revisions(self) -> None:
        """``alembic.ini`` as ``alembic init`` wrote it again, without the library's location."""
        ini = self.ini.read_text()
        self.ini.write_text(ini.replace("    sqlqueue_orm.migrations_versions:.\n", ""))

    def alembic(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        environment.pop("SQLQUEUE_URL", None)
        done = subprocess.run(
            [str(ALEMBIC), *arguments],
            cwd=self.folder,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done


def _library_tables_and_queues(database: Database) -> None:
    transport = database.transport()
    transport.create_queue("billing")
    transport.create_queue("orders")
    transport.create_delayed_table("billing")


def _check_is_clean_and_sees_the_applications_change(app: Application) -> None:
    done = app.alembic("check")
    assert "No new upgrade operations detected" in done.stdout, done.stdout + done.stderr
    app.model(extra='    sa.Column("email", sa.String(200)),\n')
    done = app.alembic("check", check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "add_column" in output and "email" in output, output
    assert "remove_table" not in output, output


def _tables(database: Database) -> set[str]:
    return set(sa.inspect(database.engine).get_table_names())


def test_beside_the_application_its_autogenerate_leaves_the_librarys_tables_alone(
    database: Database, tmp_path: Path
) -> None:
    app = Application.init(tmp_path, database.url)
    app.alembic("revision", "--autogenerate", "-m", "customers")
    app.alembic("upgrade", "head")
    assert cli.main(["--url", database.url, "migrate"]) == 0
    _library_tables_and_queues(database)
    assert {configuration.VERSION_TABLE, "billing", "orders", "customers"} <= _tables(database)
    _check_is_clean_and_sees_the_applications_change(app)


def test_inside_the_application_the_library_is_a_labelled_branch_of_its_history(
    database: Database, tmp_path: Path
) -> None:
    app = Application.init(tmp_path, database.url)
    app.include_library_revisions()
    app.alembic("upgrade", "heads")
    app.alembic(
        "revision", "--autogenerate", "-m", "customers",
        "--head", "base", "--branch-label", "app", "--version-path", "migrations/versions",
    )  # fmt: skip
    app.alembic("upgrade", "heads")
    _library_tables_and_queues(database)
    tables = _tables(database)
    assert {"OutboxData", "billing", "orders", "customers"} <= tables
    assert configuration.VERSION_TABLE not in tables
    heads = app.alembic("heads").stdout
    assert "(sqlqueue_orm)" in heads and "(app)" in heads
    current = app.alembic("current").stdout
    assert sorted(line.split()[0] for line in current.splitlines() if line.strip()) == sorted(
        line.split()[0] for line in heads.splitlines() if line.strip()
    )
    _check_is_clean_and_sees_the_applications_change(app)


def test_an_application_moves_from_sqlqueue_migrate_to_one_history_and_back(
    database: Database, tmp_path: Path
) -> None:
    app = Application.init(tmp_path, database.url)
    app.alembic("revision", "--autogenerate", "-m", "customers")
    app.alembic("upgrade", "head")
    assert cli.main(["--url", database.url, "migrate"]) == 0
    _library_tables_and_queues(database)
    # The move, as docs/migrations.md gives it.
    app.include_library_revisions()
    app.alembic("stamp", "sqlqueue_orm@head")
    with database.engine.begin() as connection:
        sa.Table(configuration.VERSION_TABLE, sa.MetaData()).drop(connection)
    done = app.alembic("upgrade", "heads")
    assert "Running upgrade" not in done.stderr, done.stderr
    (library_head,) = ScriptDirectory.from_config(environment.alembic_config()).get_heads()
    assert library_head in app.alembic("current").stdout
    _check_is_clean_and_sees_the_applications_change(app)
    # And back, as docs/migrations.md gives it.
    app.alembic("stamp", "sqlqueue_orm@base")
    app.exclude_library_revisions()
    assert library_head not in app.alembic("current").stdout
    assert cli.main(["--url", database.url, "migrate"]) == 0
    with database.engine.connect() as connection:
        recorded = sa.Table(configuration.VERSION_TABLE, sa.MetaData(), autoload_with=connection)
        assert connection.execute(sa.select(recorded.c.version_num)).scalars().all() == [
            library_head
        ]
    app.model()
    _check_is_clean_and_sees_the_applications_change(app)
