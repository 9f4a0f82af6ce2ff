"""``sqlqueue errors``: list, show, retry and delete the messages of an error queue.

::

    sqlqueue errors list [--json] [--queue ERRORQ] [--exception-type T] [--endpoint E]
                         [--message-id M] [--header NAME=VALUE] [--search TEXT] [--group ID]
                         [--limit N] [--after CURSOR]
    sqlqueue errors show ID
    sqlqueue errors groups [--by type|endpoint|message-type] [--json]
    sqlqueue errors retry ID... | --group ID | --all [--failed-queue Q] [filters] [--most N]
    sqlqueue errors delete ID... | --group ID | --all filters [--most N]

``ID`` is a message id as the list, the endpoint's log and the dashboard show it
(``NServiceBus.MessageId``), or the row id (the native ``Id``, a GUID: ``id`` in ``--json``
output), which names one message where several share a message id. ``--queue`` names the error
queue on every sub-command (default ``error``). ``retry`` sends each message back to its
``NServiceBus.FailedQ`` with the failure headers removed, one transaction per message
(:class:`~sqlqueue_orm.recoverability.error_queue.ErrorQueue`); ``--all --failed-queue Q``
retries only the messages that failed in ``Q``; ``--group ID`` the messages of a failure group
and ``--all`` with filters every message that matches them (refused when more than ``--most``
do). Groups and filters: :mod:`sqlqueue_orm.cli.errors_groups`. An id no message has, one that
several messages share, and a group id no message has, are bad input: one line naming it, exit
status 2, and nothing is changed. The plain list heads its columns: message id, time of
failure, the queue it failed in (its short name in the default schema) and the exception.
"""

from __future__ import annotations

import argparse
import base64
import json
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions, headers
from sqlqueue_orm.cli import arguments, errors_groups, listings

if TYPE_CHECKING:
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue, FailedMessage

#: The error queue of every sub-command unless ``--queue`` names another.
DEFAULT_QUEUE = "error"


def _error_queue(args: argparse.Namespace) -> ErrorQueue:
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue

    return ErrorQueue(args.context.transport, args.queue)


def _text(value: bytes) -> str | None:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def record(failed: FailedMessage) -> dict[str, Any]:
    """The JSON object of *failed*: every field; bodies and raw headers kept losslessly.

    ``body`` when the body is UTF-8 text, else ``body_base64``; ``headers`` is null and
    ``raw_headers`` (or ``raw_headers_base64`` when they are not text) holds what is stored
    when the headers cannot be read.
    """
    result: dict[str, Any] = {
        "id": failed.id,
        "message_id": failed.message_id,
        "failed_queue": failed.failed_queue,
        "exception_type": failed.exception_type,
        "exception_message": failed.exception_message,
        "time_of_failure": (
            None if failed.time_of_failure is None
            else headers.format_time(failed.time_of_failure)
        ),
        "processing_endpoint": failed.processing_endpoint,
        "headers": failed.headers or None,
    }
    if not failed.headers:
        raw = failed.raw_headers
        if isinstance(raw, bytes):
            result["raw_headers_base64"] = base64.b64encode(raw).decode("ascii")
        else:
            result["raw_headers"] = raw
    text = _text(failed.body)
    if text is None:
        result["body_base64"] = base64.b64encode(failed.body).decode("ascii")
    else:
        result["body"] = text
    return result


#: The columns of a plain ``errors list``.
HEADING = ("MESSAGE ID", "FAILED AT (UTC)", "QUEUE", "EXCEPTION")


def _cells(errors: ErrorQueue, failed: FailedMessage) -> tuple[str, str, str, str]:
    when = "-" if failed.time_of_failure is None else headers.format_time(failed.time_of_failure)
    reason = " ".join((failed.exception_message or "").split())[:120]
    kind = failed.exception_type or ("(headers cannot be read)" if not failed.headers else "-")
    return (
        failed.message_id,
        when,
        errors.shown_queue(failed) or "-",
        f"{kind}: {reason}" if reason else kind,
    )


def list_command(args: argparse.Namespace) -> int:
    """``errors list``: one line (or JSON object) per failed message, oldest first, a page."""
    errors = _error_queue(args)
    found, after = errors_groups.list_page(args, errors)
    listings.show(
        found,
        as_json=args.json,
        record=record,
        heading=HEADING,
        cells=lambda failed: _cells(errors, failed),
        none=f"no failed messages found in error queue {errors.name!r}",
    )
    if after is not None:
        print(f"more: add --after {after} for the next page", file=sys.stderr)
    return 0


def _row_ids(args: argparse.Namespace, errors: ErrorQueue, ids: Sequence[str]) -> list[str]:
    """The row id of the message each of *ids* names (its message id, or its row id).

    Refused as bad input, before any change: an id no message has, or one several messages
    share (their row ids are named, each of which names one).
    """
    from sqlqueue_orm.recoverability.search import ErrorSearch

    listing = "errors list"
    if args.queue != DEFAULT_QUEUE:
        listing += f" --queue {shlex.quote(args.queue)}"
    search = ErrorSearch(errors)
    chosen: list[str] = []
    for each in ids:
        found = search.named(each)
        if not found:
            raise exceptions.ConfigurationError(
                f"no message {each!r} in error queue {errors.name!r}: no message id or row id "
                f"is that (see: {args.context.command(listing)})"
            )
        if len(found) > 1:
            shown = ", ".join(failed.id for failed in found[:_NAMED_MOST])
            more = ", ..." if len(found) > _NAMED_MOST else ""
            raise exceptions.ConfigurationError(
                f"{len(found)} messages in error queue {errors.name!r} have message id "
                f"{each!r}: give the row id of one ({shown}{more})"
            )
        if found[0].id not in chosen:
            chosen.append(found[0].id)
    return chosen


#: Row ids an ambiguous message id's refusal names at most.
_NAMED_MOST = 5


def show_command(args: argparse.Namespace) -> int:
    """``errors show ID``: the whole message as one indented JSON object."""
    errors = _error_queue(args)
    [row_id] = _row_ids(args, errors, [args.id])
    failed = errors.get(row_id)
    if failed is None:  # taken (retried, deleted) since
        raise exceptions.ConfigurationError(
            f"no message {args.id!r} in error queue {errors.name!r} (retried or deleted just now)"
        )
    print(json.dumps(record(failed), ensure_ascii=False, indent=2))
    return 0


def retry_command(args: argparse.Namespace) -> int:
    """``errors retry``: send messages back to the queue they failed in."""
    errors = _error_queue(args)
    if (args.all or args.group is not None) == bool(args.ids):
        raise exceptions.ConfigurationError("give message ids, --group ID or --all")
    if args.failed_queue is not None and not args.all:
        raise exceptions.ConfigurationError("--failed-queue goes with --all")
    chosen = errors_groups.chosen_ids(args, errors)
    if chosen is not None:
        ids: Sequence[str] = chosen
        if args.failed_queue is not None:
            allowed = set(errors.retryable_ids(args.failed_queue))
            ids = [each for each in chosen if each in allowed]
    elif args.all:
        ids = errors.retryable_ids(args.failed_queue)
    else:
        ids = _row_ids(args, errors, args.ids)
    count = errors.retry(ids)
    print(f"{count} message(s) sent back from {errors.name}")
    if count < len(ids):
        print(f"sqlqueue: error: {len(ids) - count} message(s) were not sent back "
              "(no FailedQ header, no such queue, or taken by someone else; see the log)",
              file=sys.stderr)
        return 1
    return 0


def delete_command(args: argparse.Namespace) -> int:
    """``errors delete``: delete messages for good."""
    errors = _error_queue(args)
    if (args.all or args.group is not None) == bool(args.ids):
        raise exceptions.ConfigurationError("give message ids, --group ID or --all with filters")
    chosen = errors_groups.chosen_ids(args, errors)
    if chosen is None and args.all:
        raise exceptions.ConfigurationError("delete --all needs a filter (--header, --search, "
                                            "--group, ...)")
    ids: Sequence[str] = _row_ids(args, errors, args.ids) if chosen is None else chosen
    count = errors.delete(ids)
    print(f"{count} message(s) deleted from {errors.name}")
    return 0 if count == len(ids) else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``errors`` and its sub-commands."""
    parser = subparsers.add_parser(
        "errors", help="list, show, retry or delete the messages of an error queue"
    )
    commands = parser.add_subparsers(dest="errors_command", required=True, metavar="COMMAND")

    def add_queue(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--queue", default=DEFAULT_QUEUE,
                         help=f"the error queue (default: {DEFAULT_QUEUE})")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        add_queue(sub)
        return sub

    sub = add("list", "failed messages, oldest first")
    sub.add_argument("--json", action="store_true", help="one JSON object per line; [] for none")
    sub.add_argument("--exception-type", help="full type name, or its last part (ValueError)")
    sub.add_argument("--endpoint", help="the endpoint that failed it (ProcessingEndpoint)")
    arguments.defaulted_option(sub, "--limit", 100, "most messages shown",
                               type=arguments.positive_int)
    errors_groups.add_filters(sub)
    sub.add_argument("--after", metavar="CURSOR",
                     help="the next page: the cursor the previous page printed")
    sub.set_defaults(func=list_command)

    sub = add("show", "one failed message: headers, exception, body")
    sub.add_argument("id", metavar="ID", help="a message id (as errors list shows it) or row id")
    sub.set_defaults(func=show_command)

    sub = add("retry", "send messages back to the queue they failed in")
    sub.add_argument("ids", nargs="*", metavar="ID", help="message ids or row ids")
    sub.add_argument("--all", action="store_true", help="every message of the error queue")
    sub.add_argument("--failed-queue", help="with --all: only those that failed in this queue")
    errors_groups.add_choice(sub)
    sub.set_defaults(func=retry_command)

    sub = add("delete", "delete messages for good")
    sub.add_argument("ids", nargs="*", metavar="ID", help="message ids or row ids")
    sub.add_argument("--all", action="store_true",
                     help="every message that matches the filters (one is needed)")
    errors_groups.add_choice(sub)
    sub.set_defaults(func=delete_command)

    errors_groups.register(commands, add_queue)
