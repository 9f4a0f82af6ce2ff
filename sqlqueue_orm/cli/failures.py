"""The one error policy of the ``sqlqueue`` command line.

* Bad input (an argument, a queue name, a missing queue, a message that cannot be sent): one
  line on stderr naming the bad value, exit status 2.
* A database that cannot be reached or refuses the login, or that fails during the command: one
  line naming the database (host, or SQLite file) and the cause, exit status 1 (a SQLite file
  another process keeps locked: the file, and what to do, after a warning that it waits).
* Standard output closed early (``sqlqueue receive | head -1``): nothing taken off a queue is
  lost (the command rolls back); one line, exit status 1.
* Anything else is a bug: one line, exit status 1.

The traceback is printed only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from sqlalchemy import exc

from sqlqueue_orm import db, exceptions

log = logging.getLogger(__name__)

#: Exit status of bad input.
BAD_INPUT = 2
#: Exit status of a database (or output) failure.
FAILED = 1


class OutputClosed(exceptions.SqlQueueError):
    """Standard output was closed before everything was written; nothing was taken."""


class ArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE (see PROG --help)`` and exit 2."""
        self.exit(BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def message_of(error: BaseException) -> tuple[int, str]:
    """The exit status and the one-line message for *error*."""
    if isinstance(error, exceptions.QueueNotFound):
        return BAD_INPUT, (
            f"queue {error.queue!r} does not exist; create it with: "
            f"sqlqueue create-queue {shlex.quote(error.queue)}"
        )
    if isinstance(error, exceptions.ConfigurationError | exceptions.InvalidMessage):
        return BAD_INPUT, _one_line(error)
    if isinstance(error, exceptions.SqlQueueError):
        return FAILED, _one_line(error)
    if isinstance(error, exc.DBAPIError):
        translated = db.translate_error(error)
        if isinstance(translated, exceptions.DatabaseLocked):  # the file and what to do
            return FAILED, _one_line(translated)
        return FAILED, _one_line(f"database error: {type(error.orig).__name__}: {error.orig}")
    if isinstance(error, exc.SQLAlchemyError):
        return FAILED, _one_line(f"database error: {error}")
    return FAILED, _one_line(f"unexpected {type(error).__name__}: {error} (a bug: run with "
                             "--verbose and report the traceback)")


def run(command: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run *command* under the policy above; return the exit status."""
    verbose = int(getattr(args, "verbose", 0) or 0)
    try:
        return int(command(args) or 0)
    except KeyboardInterrupt:
        print("sqlqueue: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        status, text = message_of(error)
        if verbose:
            traceback.print_exc()
        try:
            print(f"sqlqueue: error: {text}", file=sys.stderr)
        except OSError:  # stderr is gone too: the status says it
            pass
        return status
