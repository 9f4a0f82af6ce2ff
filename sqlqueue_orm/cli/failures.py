"""The one error policy of the ``sqlqueue`` command line.

* Bad input (an argument, a queue name, a missing queue, a message that cannot be sent): one
  line on stderr naming the bad value, exit status 2.
* Every error line is one line: line breaks in it become spaces and other control characters
  are escaped (:func:`sqlqueue_orm.cli.listings.printable`).
* A database that cannot be reached or refuses the login, or that fails during the command: one
  line naming the database (host, or SQLite file) and the cause, exit status 1 (a SQLite file
  another process keeps locked: the file, and what to do, after a warning that it waits).
* Standard output closed early (``sqlqueue receive | head -1``): nothing taken off a queue is
  lost (the command rolls back); one line, exit status 1.
* Anything else is a bug: one line, exit status 1.

The traceback is printed only with ``--verbose``. A command a message or a log line suggests
(``sqlqueue create-queue orders``, `` `sqlqueue migrate` ``) names the database of the run as the
user gave it: ``--url`` with the password masked, or ``"$SQLQUEUE_URL"``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import re
import shlex
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import listings

if TYPE_CHECKING:
    from sqlqueue_orm.cli.context import CommandContext

log = logging.getLogger(__name__)

#: Exit status of bad input.
BAD_INPUT = 2
#: Exit status of a database (or output) failure.
FAILED = 1


class OutputClosed(exceptions.SqlQueueError):
    """Standard output was closed before everything was written; nothing was taken."""


class ArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line (and exit status 2).

    A mistyped option or command is what the line names, with the close match if there is one
    (``unknown option '--bdy'; did you mean '--body'?``), even when the mistake makes another
    argument look missing: a command's parser (one without commands of its own) looks for an
    unknown option among the arguments it was given before it reports any other error.
    """

    _given: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]  # typeshed overloads the namespace
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse *args*; an argument no option or positional takes is an error here."""
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            unknown = self._unknown_option(extras)
            self.error(unknown or f"unexpected argument {extras[0]!r}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE (see PROG --help)`` and exit 2."""
        if self._subparsers is None:
            message = self._unknown_option(self._given) or message
        self.exit(BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """Name a mistyped command and its close match, not the list of every command."""
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            raise argparse.ArgumentError(
                None, f"unknown command {value!r}" + _did_you_mean(value, action.choices)
            )
        super()._check_value(action, value)

    def _unknown_option(self, args: Sequence[str]) -> str | None:
        """``unknown option '--x'`` (and its close match) for the first of *args* that is one.

        An argument is taken for an option as argparse takes it: it starts with ``-``, is not
        ``-`` alone, a negative number or a text with a space, and comes before ``--``. It is
        known if it is one of this parser's options, as ``OPTION=VALUE`` too, or the start of
        some (argparse completes a unique one and names an ambiguous one itself).
        """
        known = self._option_string_actions
        for arg in args:
            if arg == "--":
                return None
            if len(arg) < 2 or arg[0] not in self.prefix_chars or " " in arg:
                continue
            if self._negative_number_matcher.match(arg):
                continue
            name = arg.partition("=")[0]
            if name in known or (not arg.startswith("--") and arg[:2] in known):
                continue
            if self.allow_abbrev and any(option.startswith(name) for option in known):
                continue
            options = [option for option in known if option.startswith("--")]
            return f"unknown option {name!r}" + _did_you_mean(name, options)
        return None


#: How alike a typed name and a known one must be to suggest it (difflib's ratio): a letter
#: left out, doubled or swapped in a name of four letters or more, not a shared ``--`` and ``o``.
_CLOSE = 0.7


def _did_you_mean(typed: str, choices: Iterable[str]) -> str:
    """``; did you mean 'X'?`` with the close match of *typed* among *choices*, else ""."""
    close = difflib.get_close_matches(typed, list(choices), n=1, cutoff=_CLOSE)
    return f"; did you mean {close[0]!r}?" if close else ""


def _one_line(text: object) -> str:
    """*text* as one line: runs of blanks and line breaks as one space, other controls escaped."""
    return listings.printable(" ".join(str(text).split()))


def message_of(error: BaseException, context: CommandContext | None = None) -> tuple[int, str]:
    """The exit status and the one-line message for *error*.

    :param context: the run's database, which the commands a message suggests name.
    """

    def on_database(text: str) -> str:
        return text if context is None else context.with_url(text)

    if isinstance(error, exceptions.QueueNotFound):
        create = f"create-queue {shlex.quote(error.queue)}"
        return BAD_INPUT, (
            f"queue {error.queue!r} does not exist; create it with: "
            + (context.command(create) if context is not None else f"sqlqueue {create}")
        )
    if isinstance(error, exceptions.ConfigurationError | exceptions.InvalidMessage):
        return BAD_INPUT, on_database(_one_line(error))
    if isinstance(error, exceptions.SqlQueueError):
        return FAILED, on_database(_one_line(error))
    from sqlalchemy import exc

    from sqlqueue_orm import db

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
        status, text = message_of(error, getattr(args, "context", None))
        if verbose:
            traceback.print_exc()
        try:
            print(f"sqlqueue: error: {text}", file=sys.stderr)
        except OSError:  # stderr is gone too: the status says it
            pass
        return status


class HintsOnThisDatabase(logging.Filter):
    """A log filter: the `` `sqlqueue ...` `` commands a line suggests name the run's database.

    :param context: the run's database.
    """

    def __init__(self, context: CommandContext) -> None:
        super().__init__()
        self.context = context

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite *record*'s message if it suggests a command; keep every record."""
        if not self.context.url_option:
            return True
        text = record.getMessage()
        if "`sqlqueue " in text:
            record.msg, record.args = self.context.with_url(text), None
        return True


@contextlib.contextmanager
def named_as_options(options: Mapping[str, str], *loggers: str) -> Iterator[None]:
    """Within the block, errors and warnings about settings name the options the user typed.

    The library names its parameters (``batch_size 5000 ...``); the command line's user typed
    ``--batch 5000``. Errors raised in the block and lines logged by *loggers* are reworded.

    :param options: parameter name to option, ``{"batch_size": "--batch"}``.
    """
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, options)) + r")\b")

    def reword(text: str) -> str:
        return pattern.sub(lambda match: options[match.group(1)], text)

    def filter_record(record: logging.LogRecord) -> bool:
        record.msg, record.args = reword(record.getMessage()), None
        return True

    targets = [logging.getLogger(name) for name in loggers]
    for logger in targets:
        logger.addFilter(filter_record)
    try:
        yield
    except exceptions.ConfigurationError as error:
        raise exceptions.ConfigurationError(reword(str(error))) from error
    finally:
        for logger in targets:
            logger.removeFilter(filter_record)
