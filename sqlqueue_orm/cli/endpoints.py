"""``sqlqueue endpoints [--json]``: the endpoint instances that beat in the last day.

One line per instance, by endpoint then newest first:
``ENDPOINT<TAB>STATE<TAB>HOST:PID<TAB>processed N (R/min)<TAB>failed N (R/min)<TAB>in flight
N/CONCURRENCY<TAB>started TIME<TAB>INSTANCE_ID`` (the rates once the instance beat for a whole
minute: a shorter run shows its counts alone), where STATE is ``running``, ``stale for 12 min``
(no heartbeat for that long: killed, hung or cut off) or ``stopped 3 min ago`` (a clean stop).
With ``--json``, one object a line (the fields of
:class:`~sqlqueue_orm.health.EndpointInstance`, times in ISO 8601 UTC); none is ``no endpoints``,
or ``[]`` with ``--json``. ``--endpoint`` and ``--state`` keep only some.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import config
from sqlqueue_orm.cli import arguments, listings

if TYPE_CHECKING:
    from sqlqueue_orm import health


def line(instance: health.EndpointInstance) -> str:
    """One instance as a line of text (see the module docstring)."""
    started = instance.record()["started_at"]
    processed, failed = f"processed {instance.processed}", f"failed {instance.failed}"
    if instance.rated:  # a shorter run's rate would claim a pace it never kept
        processed += f" ({instance.processed_rate:.1f}/min)"
        failed += f" ({instance.failed_rate:.1f}/min)"
    values = [
        instance.endpoint,
        instance.state_text,
        f"{instance.host}:{instance.process_id}",
        processed,
        failed,
        f"in flight {instance.in_flight}/{instance.concurrency}",
        f"started {started}",
        instance.instance_id,
    ]
    return "\t".join(map(listings.printable, values))


def _name(text: str) -> str:
    value = arguments.utf8_text(text)
    if not value.strip():
        raise argparse.ArgumentTypeError(f"endpoint name {text!r} is blank")
    return value


def _cmd_endpoints(args: argparse.Namespace) -> int:
    from sqlqueue_orm import health

    found = health.read_endpoints(args.context.transport.engine)
    chosen = [
        instance
        for instance in found
        if (args.endpoint is None or instance.endpoint == args.endpoint)
        and (args.state is None or instance.state == args.state)
    ]
    listings.show(
        chosen,
        as_json=args.json,
        record=lambda instance: instance.record(),
        line=line,
        none="no endpoints",
    )
    return 0


def register(commands: Any) -> None:
    """Add ``endpoints`` to the ``sqlqueue`` parser."""
    sub = commands.add_parser(
        "endpoints",
        help="list endpoint instances from their heartbeats: running, stale or stopped",
    )
    sub.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line per instance; [] for none",
    )
    sub.add_argument("--endpoint", type=_name, default=None, help="only this endpoint's")
    sub.add_argument(
        "--state",
        choices=(config.RUNNING, config.STALE, config.STOPPED),
        default=None,
        help="only instances in this state",
    )
    sub.set_defaults(func=_cmd_endpoints)
