"""The asyncio surface mirrors the synchronous one: each coroutine of AsyncTransport takes the
arguments of the Transport method it runs, and AsyncUnitOfWork those of UnitOfWork."""

import inspect

from sqlqueue_orm import Transport, UnitOfWork
from sqlqueue_orm.aio import AsyncTransport, AsyncUnitOfWork

#: The Transport methods AsyncTransport runs, as coroutines.
MIRRORED = (
    "create_queue", "create_delayed_table", "create_subscription_table", "send", "send_many",
    "reply", "publish", "subscribe", "unsubscribe", "receive", "browse", "peek",
    "browse_delayed", "purge_all", "purge_expired",
)


def _parameters(function: object) -> list[tuple[str, object, object]]:
    return [
        (name, parameter.kind, parameter.default)
        for name, parameter in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
    ]


def test_each_coroutine_takes_the_arguments_of_the_transport_method_it_runs():
    for name in MIRRORED:
        mine = getattr(AsyncTransport, name)
        assert inspect.iscoroutinefunction(mine), name
        assert _parameters(mine) == _parameters(getattr(Transport, name)), name


def test_the_async_unit_of_work_takes_the_arguments_of_the_unit_of_work():
    assert _parameters(AsyncUnitOfWork.__init__)[2:] == _parameters(UnitOfWork.__init__)[2:]
    for name in ("send", "send_many"):
        mine = getattr(AsyncUnitOfWork, name)
        assert inspect.iscoroutinefunction(mine), name
        assert _parameters(mine) == _parameters(getattr(UnitOfWork, name)), name
