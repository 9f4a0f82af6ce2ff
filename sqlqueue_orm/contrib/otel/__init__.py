"""OpenTelemetry traces and metrics, wire-compatible with NServiceBus 8+ (extra ``otel``).

::

    from sqlqueue_orm.contrib import otel

    otel.instrument()       # every transport and endpoint, with the global providers

Needs ``pip install sqlqueue_orm[otel]`` (opentelemetry-api and -sdk). It implements
:class:`sqlqueue_orm.instrumentation.Instrumentation`; the core never imports it.

Traces, named and attributed by the OpenTelemetry messaging conventions
(``messaging.system``, ``messaging.destination.name``, ``messaging.operation.type`` and
``.name``, ``messaging.message.id``, ``messaging.message.conversation_id``):

* ``send {queue}`` (PRODUCER) around each send, and around each message stored in the outbox;
  it writes the W3C ``traceparent`` (and ``tracestate``, ``baggage``) into the message headers
  through the global propagator, as NServiceBus 8+ does, so a .NET endpoint continues the trace;
* ``receive {queue}`` (CONSUMER) around each receive, linked to each message's ``traceparent``;
* ``process {queue}`` (CONSUMER) around the handlers' run, the child of the message's
  ``traceparent`` (a root linked to it when ``NServiceBus.OpenTelemetry.StartNewTrace`` is
  ``True``, as NServiceBus's ``StartNewTraceOnReceive`` asks); sends of the handlers are its
  children, so a reply continues the conversation's trace;
* ``dispatch OutboxData`` around each outbox batch that claimed records, ``move {queue}``
  around each delayed-message move that moved some (idle polls make no span).

Metrics (meter ``sqlqueue_orm``), NServiceBus's names where it has one, tagged
``nservicebus.queue`` (and ``nservicebus.message_type``, ``error.type`` where known):
``nservicebus.messaging.fetches``, ``.successes``, ``.failures`` (each failed attempt),
``.processing_time`` (s, from the receive to the handlers' end), ``.critical_time`` (s, from
``TimeSent`` or ``DeliverAt`` to the handlers' end), ``.handler_time`` (s), and
``nservicebus.recoverability.immediate``, ``.delayed`` and ``.error``; then ours:
``sqlqueue.queue.depth`` (the last peek of each queue), ``sqlqueue.outbox.backlog`` (records not
dispatched), ``sqlqueue.outbox.dispatched`` and ``sqlqueue.delayed.moved``.
"""

from __future__ import annotations

from sqlqueue_orm import exceptions

try:
    import opentelemetry.sdk  # the extra installs both: check for both
    import opentelemetry.trace  # noqa: F401
except ImportError as error:  # pragma: no cover - the extra is installed in the tests
    raise exceptions.ConfigurationError(
        "sqlqueue_orm.contrib.otel needs OpenTelemetry: pip install 'sqlqueue_orm[otel]'"
    ) from error

from sqlqueue_orm.contrib.otel.instrumentation import (
    SCOPE_NAME,
    START_NEW_TRACE,
    OpenTelemetryInstrumentation,
    instrument,
)

__all__ = [
    "SCOPE_NAME",
    "START_NEW_TRACE",
    "OpenTelemetryInstrumentation",
    "instrument",
]
