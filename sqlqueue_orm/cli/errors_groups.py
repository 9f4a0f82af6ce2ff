"""``sqlqueue errors groups`` and the search filters of ``errors list``, ``retry`` and ``delete``.

::

    sqlqueue errors groups [--by type|endpoint|message-type] [--json]
    sqlqueue errors retry --group ID          # every message of the group, each once
    sqlqueue errors delete --group ID
    sqlqueue errors list [--message-id M] [--header NAME=VALUE] [--search TEXT] [--group ID]
                         [--after CURSOR]
    sqlqueue errors retry --all [filters] [--most N]   # every message that matches, at most N

``groups`` prints one line per group, largest first, under a line heading the columns: its id,
how many messages, the first and last time of failure, and what the messages share
(:class:`~sqlqueue_orm.recoverability.groups.FailureGroups`). The id stays the same while any
message of the group is in the queue. An unknown group id is bad input: one line naming it, exit
status 2. ``list`` prints a page at a time; when there is more it says so on standard error with
the ``--after`` cursor of the next page.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import config, exceptions, headers
from sqlqueue_orm.cli import arguments, listings

if TYPE_CHECKING:
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue
    from sqlqueue_orm.recoverability.groups import FailureGroup
    from sqlqueue_orm.recoverability.search import ErrorFilter

#: Most messages ``retry --all`` or ``delete --all`` with filters takes unless ``--most``.
DEFAULT_MOST = 1000


def group_record(group: FailureGroup) -> dict[str, Any]:
    """The JSON object of *group*."""
    return {
        "id": group.id,
        "by": group.by,
        "label": group.label,
        "count": group.count,
        "first_failure": _time(group.first_failure),
        "last_failure": _time(group.last_failure),
    }


def _time(moment: Any) -> str | None:
    return None if moment is None else headers.format_time(moment)


#: The columns of a plain ``errors groups``.
HEADING = ("GROUP", "MESSAGES", "FIRST FAILURE", "LAST FAILURE", "LABEL")


def _group_cells(group: FailureGroup) -> tuple[str, str, str, str, str]:
    first, last = _time(group.first_failure) or "-", _time(group.last_failure) or "-"
    return (group.id, str(group.count), first, last, group.label)


def groups_command(args: argparse.Namespace) -> int:
    """``errors groups``: the failure groups, largest first."""
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue
    from sqlqueue_orm.recoverability.groups import FailureGroups

    errors = ErrorQueue(args.context.transport, args.queue)
    listings.show(
        FailureGroups(errors).list(args.by),
        as_json=args.json,
        record=group_record,
        heading=HEADING,
        cells=_group_cells,
        none=f"no failed messages found in error queue {errors.name!r}",
    )
    return 0


def add_filters(sub: argparse.ArgumentParser) -> None:
    """Add the search filters (all but ``--exception-type`` and ``--endpoint``)."""
    sub.add_argument("--message-id", help="NServiceBus.MessageId, or the row id")
    sub.add_argument(
        "--header", type=_header, metavar="NAME=VALUE", help="a header and its whole value"
    )
    sub.add_argument("--search", metavar="TEXT", help="text the body holds")
    sub.add_argument("--group", metavar="ID", help="a group id printed by errors groups")


def _header(text: str) -> tuple[str, str]:
    from sqlqueue_orm.recoverability.search import parse_header

    try:
        return parse_header(text)
    except exceptions.ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def filter_of(args: argparse.Namespace) -> ErrorFilter:
    """The :class:`ErrorFilter` the arguments give."""
    from sqlqueue_orm.recoverability.search import ErrorFilter

    return ErrorFilter(
        message_id=getattr(args, "message_id", None),
        header=getattr(args, "header", None),
        text=getattr(args, "search", None),
        group=getattr(args, "group", None),
        exception_type=getattr(args, "exception_type", None),
        endpoint=getattr(args, "endpoint", None),
    )


def chosen_ids(args: argparse.Namespace, errors: ErrorQueue) -> tuple[str, ...] | None:
    """The ids ``retry``/``delete`` with ``--group`` or ``--all`` and filters take, or None.

    ``--group ID`` alone: the group's messages (an unknown id is bad input). ``--all`` with
    filters: every message that matches, refused when more than ``--most`` do.
    """
    from sqlqueue_orm.recoverability.groups import FailureGroups
    from sqlqueue_orm.recoverability.search import ErrorFilter, ErrorSearch

    wanted = filter_of(args)
    if args.group is not None and not args.all and wanted == ErrorFilter(group=args.group):
        return FailureGroups(errors).ids(args.group)
    if not args.all:
        if wanted.active:
            raise exceptions.ConfigurationError("filters go with --all (or --group ID alone)")
        return None
    if not wanted.active:
        return None
    if args.group is not None:
        FailureGroups(errors).ids(args.group)  # an unknown group is bad input, not "none"
    return ErrorSearch(errors).matching_ids(wanted, most=args.most)


def add_choice(sub: argparse.ArgumentParser) -> None:
    """Add ``--group``, the filters and ``--most`` to ``retry`` or ``delete``."""
    add_filters(sub)
    sub.add_argument("--exception-type", help="with --all: full type name, or its last part")
    sub.add_argument("--endpoint", help="with --all: the endpoint that failed it")
    arguments.defaulted_option(
        sub, "--most", DEFAULT_MOST, "with --all and filters: refuse when more match",
        type=arguments.positive_int,
    )


def register(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    add_queue: Any,
) -> None:
    """Add ``errors groups``."""
    sub = commands.add_parser(
        "groups", help="failed messages grouped: same failure, endpoint or message type"
    )
    add_queue(sub)
    sub.add_argument(
        "--by",
        choices=list(config.FAILURE_GROUPINGS),
        default="type",
        help="type (exception type and stack trace; default), endpoint or message-type",
    )
    sub.add_argument("--json", action="store_true", help="one JSON object per line; [] for none")
    sub.set_defaults(func=groups_command)


def list_page(args: argparse.Namespace, errors: ErrorQueue) -> tuple[list[Any], str | None]:
    """The page ``errors list`` prints, and the cursor of the next one."""
    from sqlqueue_orm.recoverability.search import ErrorSearch

    page = ErrorSearch(errors).page(filter_of(args), after=args.after, limit=args.limit)
    return page.messages, page.next
