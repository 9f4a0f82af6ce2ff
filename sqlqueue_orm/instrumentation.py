"""Instrumentation: the hooks the core calls for traces and metrics, and nothing behind them.

The core never imports OpenTelemetry (an import-linter contract says so). It calls an
:class:`Instrumentation` when one is set, and only then::

    from sqlqueue_orm import instrumentation
    from sqlqueue_orm.contrib.otel import OpenTelemetryInstrumentation

    instrumentation.set_instrumentation(OpenTelemetryInstrumentation())   # every transport
    transport = Transport(url, instrumentation=OpenTelemetryInstrumentation())  # or one

With none set (the default), each hook site is one attribute check (``if
transport.instrumentation is not None``): the send and receive paths pay nothing else.

The hooks that wrap an operation take a ``proceed`` callable and return what it returns, so an
implementation can open a span around it, add headers to the messages going out (the W3C
``traceparent``), or time it; they must call ``proceed`` exactly once and let its exceptions
through. The others only observe. :class:`NoInstrumentation` is the do-nothing implementation
to subclass when only some hooks matter.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage

T = TypeVar("T")

#: What becomes of a received message (the pump's counts): the ``outcome`` hook's values.
OUTCOMES = ("handled", "failed", "retried", "expired", "poison")


@runtime_checkable
class Instrumentation(Protocol):
    """The hooks the core calls (see the module docstring for the ``proceed`` contract)."""

    def send(
        self,
        queue: str,
        messages: Sequence[OutgoingMessage],
        proceed: Callable[[Sequence[OutgoingMessage]], list[str]],
    ) -> list[str]:
        """Around one send of *messages* to *queue* (or their storing in the outbox).

        Call ``proceed`` with the messages to send (copies with trace headers added, or the
        same ones); return what it returns, the message ids.
        """
        ...

    def receive(
        self, queue: str, proceed: Callable[[], list[IncomingMessage]]
    ) -> list[IncomingMessage]:
        """Around one receive from *queue*; return the messages ``proceed`` took."""
        ...

    def handle(self, queue: str, message: IncomingMessage, proceed: Callable[[], None]) -> None:
        """Around the handlers' run on *message* of the endpoint *queue* (each attempt)."""
        ...

    def outcome(self, queue: str, outcome: str) -> None:
        """What became of a message the endpoint *queue* received (one of :data:`OUTCOMES`)."""
        ...

    def peeked(self, queue: str, count: int) -> None:
        """A peek estimated *count* messages in *queue* (its depth)."""
        ...

    def dispatch(self, outbox: str, proceed: Callable[[], T]) -> T:
        """Around one outbox dispatch batch of the outbox table *outbox*."""
        ...

    def dispatched(self, outbox: str, records: int, messages: int, backlog: int) -> None:
        """A dispatch batch sent *messages* of *records*; *backlog* records are left to do."""
        ...

    def move_delayed(self, queue: str, proceed: Callable[[], int]) -> int:
        """Around one move of due delayed messages into *queue*; return how many moved."""
        ...


class NoInstrumentation:
    """Every hook does nothing but call ``proceed`` (a base for partial implementations)."""

    # Each hook repeats the signature of Instrumentation's on purpose: this class is the
    # protocol's do-nothing implementation, checked against it by mypy. It does not inherit
    # the protocol: a Protocol base would end a subclass's cooperative ``__init__`` chain
    # before the subclass's other bases.

    def send(
        self,
        queue: str,
        messages: Sequence[OutgoingMessage],
        proceed: Callable[[Sequence[OutgoingMessage]], list[str]],
    ) -> list[str]:
        """Send *messages* unchanged."""
        return proceed(messages)

    def receive(
        self, queue: str, proceed: Callable[[], list[IncomingMessage]]
    ) -> list[IncomingMessage]:
        """Receive."""
        return proceed()

    def handle(self, queue: str, message: IncomingMessage, proceed: Callable[[], None]) -> None:
        """Run the handlers."""
        proceed()

    def outcome(self, queue: str, outcome: str) -> None:
        """Nothing."""

    def peeked(self, queue: str, count: int) -> None:
        """Nothing."""

    def dispatch(self, outbox: str, proceed: Callable[[], T]) -> T:
        """Dispatch."""
        return proceed()

    def dispatched(self, outbox: str, records: int, messages: int, backlog: int) -> None:
        """Nothing."""

    def move_delayed(self, queue: str, proceed: Callable[[], int]) -> int:
        """Move."""
        return proceed()


class _Global:
    """The process-wide instrumentation and the transports that follow it."""

    def __init__(self) -> None:
        self.current: Instrumentation | None = None
        self.followers: weakref.WeakSet[Instrumented] = weakref.WeakSet()
        self.lock = threading.Lock()


class Instrumented(Protocol):
    """An object with an ``instrumentation`` attribute that follows the global setting."""

    instrumentation: Instrumentation | None


_GLOBAL = _Global()


def set_instrumentation(instrumentation: Instrumentation | None) -> None:
    """Use *instrumentation* in every transport that was not given one (``None``: stop).

    Transports made before the call follow it too.
    """
    if instrumentation is not None and not isinstance(instrumentation, Instrumentation):
        from sqlqueue_orm import exceptions

        raise exceptions.ConfigurationError(
            f"{instrumentation!r} does not implement sqlqueue_orm.instrumentation.Instrumentation"
        )
    with _GLOBAL.lock:
        _GLOBAL.current = instrumentation
        for follower in list(_GLOBAL.followers):
            follower.instrumentation = instrumentation


def get_instrumentation() -> Instrumentation | None:
    """The process-wide instrumentation (``None`` when none is set)."""
    return _GLOBAL.current


def follow(instrumented: Instrumented) -> Instrumentation | None:
    """Register *instrumented* to follow :func:`set_instrumentation`; return the current one."""
    with _GLOBAL.lock:
        _GLOBAL.followers.add(instrumented)
        return _GLOBAL.current


def unfollow(instrumented: Instrumented) -> None:
    """Stop *instrumented* following :func:`set_instrumentation` (it was given its own)."""
    with _GLOBAL.lock:
        _GLOBAL.followers.discard(instrumented)
