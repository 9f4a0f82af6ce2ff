"""Running the migrations: what both ``env.py`` files do, and ``sqlqueue migrate``'s entry.

**Online.** Alembic applies the revisions the database lacks; then every upgrade run, also one
that finds the database at head, *sweeps* every queue table of the run's target through the
queue steps of the database's revision (:func:`~sqlqueue_orm.migration.operations.sweep`), so a
legacy table that appeared after its steps ran (a .NET v1 endpoint's new queue, a restored
database) is upgraded too. One INFO line per table says what was done::

    queue orders@[sales]: upgraded: 0001_expires_index, 0002_headers_nvarchar
    queue billing: already current

Downgrades, ``stamp``, ``check`` and ``current`` never sweep.

**Offline** (``--sql``). The whole script is written to memory and printed only once it is
complete, so ``> upgrade.sql`` never holds half a script. SQLite (and any database without a
script writer) is refused before anything is printed. The script starts from the revision the
database records when it can be read, so an already migrated database gets an empty or an
incremental script; an explicit range (``FROM:TO``) is used as given, without connecting. A
database that cannot be read, with no range given, is refused before anything is printed.
"""

from __future__ import annotations

import contextlib
import io
import logging.config
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from alembic.util import CommandError
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import db, exceptions
from sqlqueue_orm.migration import configuration, impl, operations, steps

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

log = logging.getLogger(__name__)


class OfflineRefused(exceptions.ConfigurationError, CommandError):
    """No offline script can be written for this database."""


class DatabaseUnreachable(exceptions.DatabaseError, CommandError):
    """The database could not be reached."""


def run(
    config: Config, revision: str = "head", *, downgrade: bool = False, sql: bool = False
) -> None:
    """Upgrade (or downgrade) to *revision*, online or as a script: ``sqlqueue migrate``.

    :param config: from :func:`~sqlqueue_orm.migration.environment.alembic_config`.
    :param revision: where to go; with *sql*, ``FROM:TO`` gives the range explicitly.
    :param downgrade: downgrade instead (offline without a range: from the database's revision).
    :param sql: print the script instead of running it.
    :raises ConfigurationError: bad input (an unknown revision, SQLite offline, ...).
    :raises DatabaseError: the database could not be reached or failed.
    """
    from alembic import command

    try:
        if downgrade:
            if sql and ":" not in revision:  # Alembic needs a range to write a downgrade
                revision = f"{database_revision(config)}:{revision}"
            command.downgrade(config, revision, sql=sql)
        else:
            command.upgrade(config, revision, sql=sql)
    except exceptions.SqlQueueError:
        raise
    except CommandError as error:
        raise exceptions.ConfigurationError(f"migrate: {error}") from error
    except sa.exc.DBAPIError as error:
        url = configuration.database_url(config, {})
        raise exceptions.DatabaseError(
            f"migrate: the database at {_where(url)}: {db.driver_cause(error)}"
        ) from error


def database_revision(config: Config, x_arguments: dict[str, str] | None = None) -> str:
    """The revision the database records in ``sqlqueue_alembic_version`` (``base``: none).

    :raises DatabaseUnreachable: the database cannot be reached (naming its host).
    """
    url = configuration.database_url(config, x_arguments or {})
    given = config.attributes.get("connection")
    if given is not None:
        with _connected(given) as connection:
            return _recorded(connection)
    try:
        engine = db.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as connection:
                return _recorded(connection)
        finally:
            engine.dispose()
    except (sa.exc.DBAPIError, ImportError) as error:
        raise DatabaseUnreachable(
            f"cannot read the revision of the database at {_where(url)} "
            f"({db.driver_cause(error)}); to write the script without it, give the range: "
            "FROM:TO (base:head from scratch)"
        ) from error


@contextlib.contextmanager
def _connected(given: Connection | Engine) -> Iterator[Connection]:
    """The caller's ``Connection``, or one of the caller's ``Engine`` (closed afterwards).

    ``config.attributes["connection"]`` holds a ``Connection`` in Alembic's cookbook recipe and
    an ``Engine`` in pytest-alembic's; the engine stays the caller's to dispose of.
    """
    if isinstance(given, Engine):
        with given.connect() as connection:
            yield connection
    else:
        yield given


def _where(url: str) -> str:
    """The host (and port) of *url*, or the file of a SQLite URL, for one-line errors."""
    address = sa.engine.make_url(url)
    where = address.host or address.database or "the default host"
    return f"{where}:{address.port}" if address.port else where


def _recorded(connection: Connection) -> str:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(
        connection, opts={"version_table": configuration.VERSION_TABLE}
    )
    heads = context.get_current_heads()
    if len(heads) > 1:
        raise exceptions.ConfigurationError(
            f"{configuration.VERSION_TABLE} holds several revisions ({', '.join(heads)}); "
            "give the range explicitly: FROM:TO"
        )
    return heads[0] if heads else "base"


def run_migrations() -> None:
    """Run the migrations Alembic asked for, online or offline (called by ``env.py``)."""
    from alembic import context

    config = context.config
    if config.config_file_name is not None and config.attributes.get("configure_logger", True):
        logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)
    x_arguments = context.get_x_argument(as_dictionary=True)
    options = configuration.options(config, x_arguments)
    if context.is_offline_mode():
        try:
            _run_offline(config, x_arguments, options)
        except (OfflineRefused, DatabaseUnreachable) as error:
            if config.cmd_opts is None:
                raise  # called from Python (or sqlqueue migrate): the caller reports it
            # The alembic console would print "FAILED: ..." to stdout, into `> upgrade.sql`.
            print(f"alembic: error: {error}", file=sys.stderr)
            raise SystemExit(2 if isinstance(error, OfflineRefused) else 1) from error
        return
    given = config.attributes.get("connection")
    if given is not None:
        with _connected(given) as connection:
            _run_online(connection, options)
        return
    url = configuration.database_url(config, x_arguments)
    engine = db.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            _run_online(connection, options)
    finally:
        engine.dispose()


def _run_offline(config: Config, x_arguments: dict[str, str], options: dict[str, Any]) -> None:
    from alembic import context

    # postgres:// and postgresql:// as psycopg's, as db.create_engine reads them online.
    url = db.engine_url(configuration.database_url(config, x_arguments)).render_as_string(
        hide_password=False
    )
    name = sa.engine.make_url(url).get_backend_name()
    if not impl.impl_for(name).offline:
        raise OfflineRefused(
            f"offline scripts (--sql) are written for SQL Server and PostgreSQL, not {name}; "
            "migrate SQLite online (`sqlqueue migrate`, or alembic upgrade head without --sql)"
        )
    script = io.StringIO()
    settings: dict[str, Any] = {
        "url": url,
        "literal_binds": True,
        "dialect_opts": {"paramstyle": "named"},
        "output_buffer": script,
        **options,
    }
    # The range as the command got it ("FROM:TO"): Alembic resolves "base" and "no range" alike,
    # so read the raw option, from a first configure() kept quiet (its "Context impl" lines
    # would come twice, and before a refusal that must be the only line).
    quiet = logging.getLogger("alembic.runtime.migration")
    was_disabled, quiet.disabled = quiet.disabled, True
    try:
        context.configure(**settings)
    finally:
        quiet.disabled = was_disabled
    environment_context = context.get_context().environment_context
    assert environment_context is not None
    if environment_context.context_opts.get("starting_rev") is None:
        context.configure(**settings, starting_rev=database_revision(config, x_arguments))
    with context.begin_transaction():
        context.run_migrations()
    out = config.output_buffer or sys.stdout
    out.write(script.getvalue())
    out.flush()


def _run_online(connection: Connection, options: dict[str, Any]) -> None:
    from alembic import context

    if impl.impl_for(connection.dialect).transactional_ddl:
        # sqlqueue_orm's SQLite engines begin transactions themselves (BEGIN IMMEDIATE), which
        # makes DDL transactional: a revision commits whole or not at all.
        options = {**options, "transactional_ddl": True}
    options = {**options, operations.REPORT_OPTION: operations.Report()}
    context.configure(connection=connection, **options)
    with context.begin_transaction():
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()
    migration = context.get_context()
    if _is_upgrade(migration):
        operations.sweep(migration, _queue_steps(migration))


def _is_upgrade(migration: MigrationContext) -> bool:
    # Alembic hands env.py no direction: command.upgrade() runs it with its inner function
    # ``upgrade``; downgrade, stamp, check and current use others, and must never sweep.
    function = migration.opts.get("fn")
    return getattr(function, "__name__", None) == "upgrade"


def _queue_steps(migration: MigrationContext) -> list[str]:
    """The queue steps included in the database's revision, oldest first."""
    heads = migration.get_current_heads()
    script = migration.script
    if not heads or script is None:
        return []
    lineage = [revision.revision for revision in script.iterate_revisions(heads, "base")]
    return [revision for revision in reversed(lineage) if revision in steps.STEPS]
