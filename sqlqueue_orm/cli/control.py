"""``sqlqueue control``: pause, resume and resize running endpoints live, and the action log.

::

    sqlqueue control pause ENDPOINT
    sqlqueue control resume ENDPOINT
    sqlqueue control concurrency ENDPOINT N|default
    sqlqueue control show [ENDPOINT] [--json]
    sqlqueue control log [ENDPOINT] [--limit N] [--json]

Every running process of the endpoint applies a change within about a second
(:mod:`sqlqueue_orm.control`): paused, it takes no message (handlers in flight finish);
``concurrency`` sets its input queue's workers (``default``: back to its configured
concurrency). Each change is logged with this host and operating-system user. An endpoint with
neither a queue nor a control row, a resume of one never paused, or a concurrency that is not a
whole number from 1 is bad input: one line naming it, exit status 2, nothing changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import config, exceptions
from sqlqueue_orm.cli import arguments, listings

if TYPE_CHECKING:
    from sqlqueue_orm import control

_concurrency_number = arguments.bounded_int(1, config.MAX_CONCURRENCY)


def concurrency(text: str) -> int | None:
    """Argument type: a concurrency from 1 to ``MAX_CONCURRENCY``, or ``default`` (None)."""
    if text.strip().lower() == "default":
        return None
    return _concurrency_number(text)


concurrency.__name__ = "concurrency"  # what argparse names in its own messages


def _time(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _record(value: control.ControlState | control.LoggedAction) -> dict[str, Any]:
    """The JSON object of a control record: its fields in order, times as UTC text."""
    fields = dataclasses.asdict(value)
    return {
        name: _time(item) if isinstance(item, dt.datetime) else item
        for name, item in fields.items()
    }


def state_record(state: control.ControlState) -> dict[str, Any]:
    """The JSON object of one endpoint's control state."""
    return _record(state)


def _state_line(state: control.ControlState) -> str:
    running = "paused" if state.paused else "running"
    workers = "configured" if state.concurrency is None else str(state.concurrency)
    return (
        f"{listings.printable(state.endpoint)}  {running}  concurrency {workers}  "
        f"(changed {_time(state.changed_at)} by {listings.printable(state.changed_by)})"
    )


def action_record(action: control.LoggedAction) -> dict[str, Any]:
    """The JSON object of one action-log row."""
    return _record(action)


def _action_line(action: control.LoggedAction) -> str:
    values = (action.endpoint, action.action, action.who)
    endpoint, what, who = map(listings.printable, values)
    return f"{_time(action.at)}  {endpoint}  {what}  by {who}"


def pause_command(args: argparse.Namespace) -> int:
    """``control pause``: the endpoint's processes stop taking messages."""
    from sqlqueue_orm import control

    state = control.pause(args.context.transport, args.endpoint)
    print(f"paused {state.endpoint} (its processes stop taking messages within about a second)")
    return 0


def resume_command(args: argparse.Namespace) -> int:
    """``control resume``: the endpoint's processes take messages again."""
    from sqlqueue_orm import control

    state = control.resume(args.context.transport, args.endpoint)
    print(f"resumed {state.endpoint}")
    return 0


def concurrency_command(args: argparse.Namespace) -> int:
    """``control concurrency``: the workers of the endpoint's input queue, per process."""
    from sqlqueue_orm import control

    state = control.set_concurrency(args.context.transport, args.endpoint, args.concurrency)
    shown = "its configured one" if state.concurrency is None else str(state.concurrency)
    print(f"concurrency of {state.endpoint} set to {shown}")
    return 0


def show_command(args: argparse.Namespace) -> int:
    """``control show``: the control state of one endpoint, or of every controlled one."""
    from sqlqueue_orm import control

    transport = args.context.transport
    if args.endpoint is None:
        states = control.states(transport)
    else:
        state = control.state(transport, args.endpoint)
        if state is None:
            try:
                transport.peek(args.endpoint)
            except exceptions.QueueNotFound:
                raise exceptions.ConfigurationError(
                    f"unknown endpoint {args.endpoint!r}: no queue of that name and no control row"
                ) from None
            if not args.json:
                print(f"{args.endpoint}  running  concurrency configured  (never changed)")
                return 0
        states = [] if state is None else [state]
    listings.show(
        states,
        as_json=args.json,
        record=state_record,
        line=_state_line,
        none="no endpoint has been paused or resized",
    )
    return 0


def log_command(args: argparse.Namespace) -> int:
    """``control log``: the changes, newest first."""
    from sqlqueue_orm import control

    actions = control.log(args.context.transport, args.endpoint, limit=args.limit)
    listings.show(
        actions,
        as_json=args.json,
        record=action_record,
        line=_action_line,
        none="no changes logged" + (f" for endpoint {args.endpoint!r}" if args.endpoint else ""),
    )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``control`` and its sub-commands."""
    parser = subparsers.add_parser(
        "control", help="pause, resume or resize running endpoints live; the action log"
    )
    commands = parser.add_subparsers(dest="control_command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, endpoint: str = "one") -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        if endpoint == "one":
            sub.add_argument(
                "endpoint",
                metavar="ENDPOINT",
                type=arguments.utf8_text,
                help="the endpoint's name (its input queue)",
            )
        else:
            sub.add_argument(
                "endpoint",
                metavar="ENDPOINT",
                nargs="?",
                type=arguments.utf8_text,
                help="only this endpoint",
            )
        return sub

    sub = add("pause", "stop taking messages in every process (handlers in flight finish)")
    sub.set_defaults(func=pause_command)
    sub = add("resume", "take messages again")
    sub.set_defaults(func=resume_command)
    sub = add("concurrency", "set the input queue's workers per process")
    sub.add_argument(
        "concurrency",
        metavar="N",
        type=concurrency,
        help=f"1 to {config.MAX_CONCURRENCY}, or default (the configured one)",
    )
    sub.set_defaults(func=concurrency_command)
    sub = add("show", "paused or running, and the concurrency override", endpoint="optional")
    sub.add_argument("--json", action="store_true", help="one JSON object per line; [] for none")
    sub.set_defaults(func=show_command)
    sub = add(
        "log", "who paused, resumed or resized which endpoint, newest first", endpoint="optional"
    )
    arguments.defaulted_option(
        sub, "--limit", 100, "most changes shown", type=arguments.positive_int
    )
    sub.add_argument("--json", action="store_true", help="one JSON object per line; [] for none")
    sub.set_defaults(func=log_command)
