"""Checks of the Spark pipelines' inputs that need no Spark: URLs, numbers, queues, paths.

The pipelines call them first, and ``sqlqueue spark ...`` calls them before it starts Spark (a
JVM takes seconds to start): a mistake is reported at once, in one line naming the value, as a
:class:`~sqlqueue_orm.exceptions.ConfigurationError` (exit 2), and a database that cannot be
reached as a :class:`~sqlqueue_orm.exceptions.DatabaseError` naming the host and the cause
(exit 1). Nothing here imports PySpark, and SQLAlchemy only in the checks that use it: the
command line's parser reads :data:`MAX_INGEST_BATCH_SIZE` without loading it.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    import sqlalchemy as sa

    from sqlqueue_orm import addressing

#: Largest batch ``ingest`` takes (the driver holds one batch's keys, ~60 bytes a row).
MAX_INGEST_BATCH_SIZE = 1_000_000


def check_url(url: str) -> sa.URL:
    """Parse *url*; Spark tasks (other processes) must be able to open it.

    :raises ConfigurationError: not a string, not a URL, or an in-memory SQLite database.
    """
    import sqlalchemy as sa

    from sqlqueue_orm import dialects

    if not isinstance(url, str):
        raise exceptions.ConfigurationError(
            f"Spark tasks connect by URL string; got {url!r} (pass engine.url.render_as_string())"
        )
    try:
        parsed = sa.make_url(url)
    except Exception as error:  # any parse failure: say which URL
        raise exceptions.ConfigurationError(f"cannot use database URL {url!r}: {error}") from error
    embedded = dialects.for_dialect(parsed.get_backend_name()).embedded
    if embedded and parsed.database in (None, "", ":memory:"):
        raise exceptions.ConfigurationError(
            f"database URL {url!r} is an in-memory SQLite database, which Spark tasks (other "
            "processes) cannot open; use a file: sqlite:///path/to/file.db"
        )
    return parsed


def check_positive(name: str, value: object, maximum: int | None = None) -> int:
    """*value* as a whole number from 1 to *maximum*.

    :raises ConfigurationError: naming *name* and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise exceptions.ConfigurationError(f"{name} {value!r} must be a positive integer")
    if maximum is not None and value > maximum:
        raise exceptions.ConfigurationError(f"{name} {value!r} must be at most {maximum}")
    return value


def require_queue(engine: sa.Engine, address: addressing.QueueAddress) -> None:
    """Raise :class:`QueueNotFound` unless the queue table exists (driver errors translated)."""
    from sqlqueue_orm import db

    with db.wrap_db_errors(str(address)), engine.connect() as connection:
        found = db.column_names(connection, address)
    if not found:
        raise exceptions.QueueNotFound(str(address))


def check_ingest_arguments(
    url: str,
    queue: str | addressing.QueueAddress,
    batch_size: int,
    partitions: int | None = None,
    max_batches: int | None = None,
) -> tuple[sa.URL, addressing.QueueAddress]:
    """The parsed URL and queue address of an ingestion, its numbers checked.

    :raises ConfigurationError: naming the first bad value.
    """
    from sqlqueue_orm import addressing

    parsed_url = check_url(url)
    check_positive("batch_size", batch_size, MAX_INGEST_BATCH_SIZE)
    if partitions is not None:
        check_positive("partitions", partitions)
    if max_batches is not None:
        check_positive("max_batches", max_batches)
    address = addressing.QueueAddress.coerce(queue)
    if address.catalog is not None:
        raise exceptions.ConfigurationError(
            f"queue {str(address)!r} is in another catalog; ingest it with that database's URL"
        )
    return parsed_url, address


def digest(text: str) -> str:
    """A short, stable digest of *text* (lock and file names)."""
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:10]


def is_local(path: str) -> bool:
    """Whether *path* is a local file path (no ``scheme://``), which can be checked here."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """*path* without a ``file://`` prefix."""
    return path[len("file://"):] if path.startswith("file://") else path


def check_readable(what: str, path: str) -> None:
    """A local *path* must exist and be readable (remote paths are checked by Spark).

    :raises ConfigurationError: naming *what* and the path.
    """
    if not is_local(path):
        return
    local = local_path(path)
    if not os.path.exists(local):
        raise exceptions.ConfigurationError(f"{what} {path!r} does not exist")
    if not os.access(local, os.R_OK | (os.X_OK if os.path.isdir(local) else 0)):
        raise exceptions.ConfigurationError(f"{what} {path!r} is not readable")


def check_dataset(path: str, limit: int = 1_000) -> None:
    """A local dataset directory must hold only Parquet files (outside ``_`` and ``.`` entries).

    Looks at the first *limit* files only, so a large dataset is not walked whole.

    :raises ConfigurationError: naming the path and a file that is not Parquet.
    """
    check_readable("dataset path", path)
    if not is_local(path):
        return
    local = local_path(path)
    if not os.path.isdir(local):
        if not local.endswith(".parquet"):
            raise exceptions.ConfigurationError(
                f"dataset path {path!r} is neither a dataset directory nor a .parquet file"
            )
        return
    seen = 0
    for directory, subdirectories, names in os.walk(local):
        subdirectories[:] = [name for name in subdirectories if not name.startswith(("_", "."))]
        for name in names:
            if name.startswith(("_", ".")):
                continue
            if not name.endswith(".parquet"):
                found = os.path.relpath(os.path.join(directory, name), local)
                raise exceptions.ConfigurationError(
                    f"dataset path {path!r} is not an ingested dataset: {found!r} is not Parquet"
                )
            seen += 1
            if seen >= limit:
                return


def check_existing_directory(what: str, path: str) -> None:
    """A local *path* must be an existing, writable directory.

    :raises ConfigurationError: naming *what* and the path.
    """
    if not os.path.isdir(path):
        raise exceptions.ConfigurationError(f"{what} {path!r} does not exist")
    if not os.access(path, os.W_OK | os.X_OK):
        raise exceptions.ConfigurationError(f"{what} {path!r} is not writable")


def check_writable_directory(what: str, path: str) -> None:
    """A local *path* must be a writable directory, or creatable in one.

    :raises ConfigurationError: naming *what* and the path.
    """
    if not is_local(path):
        return
    local = os.path.abspath(local_path(path))
    if os.path.exists(local) and not os.path.isdir(local):
        raise exceptions.ConfigurationError(f"{what} {path!r} is a file, not a directory")
    existing = local
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise exceptions.ConfigurationError(
            f"{what} {path!r} cannot be created: {existing!r} is a file"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise exceptions.ConfigurationError(f"{what} {path!r} is not writable")


def describe_database(url: sa.URL) -> str:
    """Where *url* points, for an error line: the SQLite file, else ``host:port/database``."""
    from sqlqueue_orm import dialects

    if dialects.for_dialect(url.get_backend_name()).embedded:
        return f"SQLite file {url.database!r}"
    port = f":{url.port}" if url.port else ""
    return f"{url.host or 'localhost'}{port}/{url.database or ''}"


def check_database(url: str, queue: str | None = None) -> addressing.QueueAddress | None:
    """Connect once to *url*; with *queue*, check that its table exists and return its address.

    :raises DatabaseError: one line naming the host (or SQLite file) and the driver's cause.
    :raises ConfigurationError: the queue name is not valid or its table does not exist.
    """
    import sqlalchemy as sa

    from sqlqueue_orm import addressing, db

    parsed = check_url(url)
    address = None
    if queue is not None:
        address = addressing.QueueAddress.coerce(queue)
        address.check_for(parsed.get_backend_name())
    engine = db.create_engine(parsed, poolclass=sa.pool.NullPool)
    try:
        try:
            connection = engine.connect()
        except sa.exc.DBAPIError as error:
            raise exceptions.DatabaseError(
                f"cannot reach the database at {describe_database(parsed)}: "
                f"{db.driver_cause(error)}"
            ) from error
        with connection:
            if address is None:
                return None
            with db.wrap_db_errors(str(address)):
                found = db.column_names(connection, address)
    finally:
        engine.dispose()
    if not found:
        raise exceptions.ConfigurationError(
            f"queue {str(address)!r} does not exist; create it with "
            f"`sqlqueue create-queue {address}`"
        )
    return address
