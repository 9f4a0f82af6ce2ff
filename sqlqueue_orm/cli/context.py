"""What every sub-command is given: the database URL, resolved once, and one Transport.

:func:`sqlqueue_orm.cli.main` builds a :class:`CommandContext` after parsing and sets it on the
parsed arguments as ``args.context``; a command reads ``args.context.url`` or
``args.context.transport``. The transport is made (and its database reached) on first use, so
commands that need no database (``ddl``, ``migrate --sql``) never connect.

A SQLite file that does not exist is created only by the commands that create things
(``create-queue``, ``run`` whose endpoint creates its queues, ``migrate``; each sets
``creates_database`` on its arguments): any other says the file does not exist and creates
nothing, so a mistyped path is not a new empty database. A send to a missing file is refused too:
its queue cannot exist there.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import arguments

if TYPE_CHECKING:
    import sqlalchemy as sa

    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)


class DatabaseUnreachable(exceptions.DatabaseError):
    """The database cannot be reached, or refuses the login."""


class CommandContext:
    """The resolved ``--url`` and the :class:`Transport` of one ``sqlqueue`` run.

    :param url: the database URL.
    :param verbose: how many ``-v`` were given.
    :param source: where *url* came from: ``"option"`` (``--url``), ``"environment"``
        (``$SQLQUEUE_URL``) or ``"default"``; the commands a hint suggests name it the same way.
    :param creates: whether the command creates things (then a missing SQLite file is made).
    """

    def __init__(
        self, url: str, verbose: int = 0, source: str = "option", creates: bool = False
    ) -> None:
        # Alike the handler context's constructor (receiving/handling.py) only in shape.
        self.url = url
        self.verbose = verbose
        self.source = source
        self.creates = creates
        self._transport: Transport | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CommandContext:
        """The context of parsed arguments (``--url``, ``$SQLQUEUE_URL`` or the default)."""
        return cls(
            arguments.resolve_url(args),
            int(getattr(args, "verbose", 0) or 0),
            arguments.url_source(args),
            bool(getattr(args, "creates_database", False)),
        )

    @property
    def url_option(self) -> str:
        """``--url ...`` as a suggested command must repeat it ("" for the default database).

        The password is masked; a URL taken from the environment is named by its variable, so
        the hint stays true without showing it.
        """
        if self.source == "default":
            return ""
        if self.source == "environment":
            return f'--url "${arguments.URL_VARIABLE}"'
        import sqlalchemy as sa

        try:
            shown = sa.make_url(self.url).render_as_string(hide_password=True)
        except Exception:  # not a URL SQLAlchemy reads: as typed, a password masked
            shown = _masked(self.url)
        return f"--url {shlex.quote(shown)}"

    def command(self, text: str) -> str:
        """``sqlqueue TEXT`` as a hint shows it: on this run's database (see :attr:`url_option`)."""
        option = self.url_option
        return f"sqlqueue {text} {option}" if option else f"sqlqueue {text}"

    def with_url(self, message: str) -> str:
        """*message* with each suggested `` `sqlqueue ...` `` command made one on this database.

        Commands that name a ``--url`` already (another database's) are left as they are.
        """
        if not self.url_option:
            return message

        def repeat(match: re.Match[str]) -> str:
            text = match.group(1)
            if re.search(r"(^|\s)--url\b", text):
                return match.group(0)
            return f"`{self.command(text)}`"

        return _SUGGESTED.sub(repeat, message)

    @property
    def where(self) -> str:
        """The database as a person names it: host, port and database, or the SQLite file."""
        return describe_url(self.url)

    @property
    def transport(self) -> Transport:
        """The run's transport, made on first use after one connection proved the database."""
        if self._transport is None:
            from sqlqueue_orm.transport import Transport

            if not self.creates:
                require_file(self.url)
            try:
                transport = Transport(self.url)
            except exceptions.ConfigurationError as error:
                cause = str(error.__cause__ or error)
                raise exceptions.ConfigurationError(
                    f"cannot use database URL {describe_url(self.url, full=True)}: {cause}"
                ) from error
            try:
                check_reachable(transport.engine, self.url)
            except BaseException:
                transport.close()
                raise
            self._transport = transport
        return self._transport

    def close(self) -> None:
        """Close the transport if one was made."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None


#: A command a message suggests, in backquotes: `` `sqlqueue migrate` ``.
_SUGGESTED = re.compile(r"`sqlqueue ([^`]+)`")


def describe_url(url: str, *, full: bool = False) -> str:
    """*url* without its password, as ``host:port/database`` or the SQLite file path.

    :param full: the whole URL, password masked, instead.
    """
    import sqlalchemy as sa

    from sqlqueue_orm import dialects

    try:
        parsed = sa.make_url(url)
    except Exception:  # not a URL SQLAlchemy reads: as typed, a password masked
        return repr(_masked(url))
    if full:
        return repr(parsed.render_as_string(hide_password=True))
    if dialects.for_dialect(parsed.get_backend_name()).embedded:
        return f"SQLite file {parsed.database or ':memory:'}"
    host = parsed.host or "localhost"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.get_backend_name()} server {host}{port}, database {parsed.database!r}"


#: The password of ``scheme://user:password@host`` in a URL SQLAlchemy cannot read: up to the
#: last ``@``, so a password holding ``/`` or ``@`` is masked whole.
_PASSWORD = re.compile(r"(//[^/@:]*:).*@")


def _masked(url: str) -> str:
    """*url* as typed, but for the password it may hold (``***``, as SQLAlchemy shows it)."""
    return _PASSWORD.sub(r"\1***@", url)


def require_file(url: str) -> None:
    """Raise :class:`DatabaseUnreachable` if *url* is an embedded database's missing file."""
    import sqlalchemy as sa

    from sqlqueue_orm import dialects

    try:
        parsed = sa.make_url(url)
    except Exception:  # not a URL: Transport says so, naming it
        return
    if not dialects.for_dialect(parsed.get_backend_name()).embedded:
        return
    path = parsed.database
    if not path or path == ":memory:" or path.startswith("file:") or parsed.query.get("uri"):
        return  # in memory, or a URI whose mode= says what to do
    if not os.path.exists(path):
        raise DatabaseUnreachable(
            f"the {describe_url(url)} does not exist (nothing was created); check --url, or "
            "create it with `sqlqueue create-queue NAME` or `sqlqueue migrate`"
        )


def check_reachable(engine: sa.Engine, url: str) -> None:
    """Open and close one connection; raise :class:`DatabaseUnreachable` naming host and cause."""
    import sqlalchemy as sa

    try:
        with engine.connect():
            pass
    except sa.exc.DBAPIError as error:
        raise DatabaseUnreachable(
            f"cannot connect to the {describe_url(url)}: {_cause(url, error)}"
        ) from error


def _cause(url: str, error: sa.exc.DBAPIError) -> str:
    """The driver's reason, on one line, without the parts that repeat host and port."""
    import sqlalchemy as sa

    from sqlqueue_orm import dialects

    # The first line: drivers add hints below it ("Is the server running on that host...").
    text = " ".join((str(error.orig).strip().splitlines() or [""])[0].split())
    parsed = sa.make_url(url)
    if dialects.for_dialect(parsed.get_backend_name()).embedded:
        directory = os.path.dirname(os.path.abspath(parsed.database or "")) or "."
        if not os.path.isdir(directory):
            return f"{text} (directory {directory} does not exist)"
        return text
    # psycopg: 'connection failed: connection to server at "h", port p failed: FATAL: reason'
    _, found, reason = text.rpartition(" failed: ")
    if found and reason:
        text = reason
    for prefix in ("FATAL:", "ERROR:"):
        if text.startswith(prefix):
            text = text[len(prefix):].strip()
    return text
