"""pytest-alembic's built-in checks, run against the library's history on every database.

pytest-alembic hands its engine to the environment as an ``Engine`` in
``config.attributes["connection"]`` (Alembic's cookbook recipe passes a ``Connection`` there):
the environment takes either. The checks: one head; upgrade from base to head one revision at a
time; the models match the DDL the revisions create (autogenerate finds nothing); every
revision's downgrade, and its upgrade again, succeed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_alembic import tests as builtin
from pytest_alembic.config import Config
from pytest_alembic.runner import MigrationContext, runner

from sqlqueue_orm.migration import environment
from tests.conftest import Database


@pytest.fixture
def alembic_runner(database: Database) -> Iterator[MigrationContext]:
    """pytest-alembic's runner on the packaged scripts and the test's database engine."""
    config = Config(alembic_config=environment.alembic_config())
    with runner(config=config, engine=database.engine) as context:
        yield context


def test_single_head_revision(alembic_runner: MigrationContext) -> None:
    builtin.test_single_head_revision(alembic_runner)


def test_upgrade(alembic_runner: MigrationContext) -> None:
    builtin.test_upgrade(alembic_runner)


def test_model_definitions_match_ddl(alembic_runner: MigrationContext) -> None:
    builtin.test_model_definitions_match_ddl(alembic_runner)


def test_up_down_consistency(alembic_runner: MigrationContext) -> None:
    builtin.test_up_down_consistency(alembic_runner)
