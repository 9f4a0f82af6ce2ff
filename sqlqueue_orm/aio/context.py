"""The async handler's side of an AsyncEndpoint: its context, and its call from the core.

:class:`AsyncHandlerContext` is what an ``async def`` handler gets: the synchronous
:class:`~sqlqueue_orm.receiving.handling.HandlerContext` of the message's mode, with an
``AsyncSession`` and coroutines. :func:`bridged` makes the handler what the synchronous core
calls, awaiting it on the event loop from SQLAlchemy's greenlet bridge.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession

from sqlqueue_orm import addressing, exceptions, sqlalchemy_internals
from sqlqueue_orm.receiving.handling import HandlerContext, MessageView, Outgoing

if TYPE_CHECKING:
    import datetime as dt

    from sqlalchemy.orm import Session

__all__ = ["AsyncHandler", "AsyncHandlerContext", "bridged"]

#: An ``async def`` handler: the message (a model, or the body bytes) and its context.
AsyncHandler = Callable[[Any, "AsyncHandlerContext"], Awaitable[object]]


class AsyncHandlerContext(MessageView):
    """What an async handler gets besides its message: ids, headers, session, send and reply.

    The :class:`~sqlqueue_orm.receiving.handling.HandlerContext` of the message's mode, with
    an ``AsyncSession`` and coroutines: each call runs the synchronous context's own.
    """

    __slots__ = ("_context", "_session", "message")

    def __init__(self, context: HandlerContext) -> None:
        self._context = context
        #: The message being handled, as it was received.
        self.message = context.message
        self._session: AsyncSession | None = None


    @property
    def session(self) -> AsyncSession:
        """The ``AsyncSession`` of this message's handling, bound as the mode says.

        Over the mode's ORM session (made on first use): in TRANSACTION_SCOPE it is in the
        receive's transaction, inside the message's SAVEPOINT, opened when it first reaches the
        database. The mode commits (or rolls back) and closes it after the handlers.
        """
        session = self._session
        if session is None:
            # made here without a statement: the event loop runs this, not the bridge
            made: Session = self._context.deferred_session()
            session = self._session = AsyncSession(
                sync_session_class=lambda **_: made  # type: ignore[arg-type]
            )
        return session

    async def send(
        self,
        destination: str | addressing.QueueAddress,
        message: Outgoing,
        *,
        reply_to_this_instance: bool = False,
    ) -> str:
        """Send *message* as the mode sends (:meth:`HandlerContext.send`); return its id."""
        return await sqlalchemy_internals.greenlet_spawn(
            lambda: self._context.send(
                destination, message, reply_to_this_instance=reply_to_this_instance
            )
        )

    async def reply(self, message: Outgoing) -> str:
        """Send *message* to the incoming ``ReplyToAddress`` (:meth:`HandlerContext.reply`)."""
        return await sqlalchemy_internals.greenlet_spawn(self._context.reply, message)

    async def publish(self, event: Outgoing) -> str:
        """Publish *event* to its subscribers as the mode sends (:meth:`HandlerContext.publish`)."""
        return await sqlalchemy_internals.greenlet_spawn(self._context.publish, event)

    # The arguments repeat HandlerContext.defer's on purpose: they are handed to it as they are.
    async def defer(
        self,
        message: Outgoing,
        *,
        delay: dt.timedelta | float | None = None,
        deliver_at: dt.datetime | None = None,
        destination: str | addressing.QueueAddress | None = None,
    ) -> str:
        """Send *message* later (:meth:`HandlerContext.defer`); return its message id."""
        return await sqlalchemy_internals.greenlet_spawn(
            lambda: self._context.defer(
                message, delay=delay, deliver_at=deliver_at, destination=destination
            )
        )


def bridged(handler: AsyncHandler) -> Callable[[Any, HandlerContext], None]:
    """*handler* as the synchronous core calls handlers: awaited on the event loop."""
    if not inspect.iscoroutinefunction(handler):
        raise exceptions.ConfigurationError(
            f"AsyncEndpoint handlers are async def functions, not {handler!r}: its receive, "
            "session and sends run on the event loop's connection, which a synchronous "
            "handler on a thread cannot join; make it async (a blocking call inside it: "
            "await asyncio.to_thread(...)), or run it on an Endpoint"
        )

    def run(body: Any, context: HandlerContext) -> None:
        sqlalchemy_internals.await_in_greenlet(handler(body, AsyncHandlerContext(context)))

    return run
