"""What the instrumentation hooks cost: send and receive, one message per call, four ways.

* ``sqlqueue_orm, before the hooks``: the bodies the hooks guard (``_send_many``,
  ``_receive``), called directly: the path without any hook;
* ``sqlqueue_orm, instrumentation off``: the public methods with none set (the default):
  the one attribute check more;
* ``sqlqueue_orm, no-op instrumentation``: :class:`NoInstrumentation` set: the hook calls;
* ``sqlqueue_orm, OpenTelemetry``: the OpenTelemetry SDK recording every span (a batch
  processor, whose exporter drops them) and the metrics, traceparent written into each message.

Each side sends *messages* messages to a queue of its own, then receives them one by one, and
checks each arrived exactly once. Sides alternate twice (off, no-op, OTel, before; then again)
and the faster run of each is kept, so a burst of load on a shared machine hits one run, not a
side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from benchmarks import workers, workload
from benchmarks.workload import Result
from sqlqueue_orm import instrumentation

if TYPE_CHECKING:
    from benchmarks.harness import Run
    from sqlqueue_orm import Transport

BEFORE = f"{workers.OURS}, before the hooks"
OFF = f"{workers.OURS}, instrumentation off"
NO_OP = f"{workers.OURS}, no-op instrumentation"
OTEL = f"{workers.OURS}, OpenTelemetry"


def _opentelemetry() -> tuple[instrumentation.Instrumentation, Callable[[], None]] | str:
    """An SDK-backed instrumentation and its shutdown, or why there is none."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        from sqlqueue_orm.contrib.otel import OpenTelemetryInstrumentation
    except Exception as error:  # the extra is not installed
        return f"needs the otel extra: {error}"

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[object]) -> SpanExportResult:  # type: ignore[override]
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Dropped()))
    meter_provider = MeterProvider()

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return OpenTelemetryInstrumentation(tracer_provider, meter_provider), shutdown


def instrumentation_cost(run: Run) -> None:
    """Send 1/txn and receive 1/call with each side (see the module docstring)."""
    transport = run.transport
    n = run.settings.messages
    otel = _opentelemetry()
    sides: list[tuple[str, instrumentation.Instrumentation | None, bool]] = [
        (OFF, None, False),
        (NO_OP, instrumentation.NoInstrumentation(), False),
        (BEFORE, None, True),
    ]
    if isinstance(otel, str):
        run.skip("send 1/txn, instrumentation", OTEL, otel)
        run.skip("receive 1/call, instrumentation", OTEL, otel)
    else:
        sides.insert(2, (OTEL, otel[0], False))
    best: dict[tuple[str, str], workload.Timing] = {}
    kept = transport.instrumentation
    try:
        for _ in range(2):
            for side, hooks, bypass in sides:
                transport.instrumentation = hooks
                queue = run.new_queue("instr")
                for scenario, timing in _send_then_receive(transport, queue, n, bypass):
                    key = (scenario, side)
                    if key not in best or timing.seconds < best[key].seconds:
                        best[key] = timing
    finally:
        transport.instrumentation = kept
        if not isinstance(otel, str):
            otel[1]()
    for (scenario, side), timing in best.items():
        run.add(Result.of(run.database.name, scenario, side, timing, note="best of 2 runs"))


def _send_then_receive(
    transport: Transport, queue: str, n: int, bypass: bool
) -> list[tuple[str, workload.Timing]]:
    messages = iter(workload.outgoing(0, n))
    workload.warm_up(transport, queue)  # the first-use look-up of the table, untimed
    if bypass:
        sent = workload.timed(
            n,
            1,
            lambda: transport._send_many(
                transport.queues.table_queue(queue), [next(messages)], None
            ),
        )
    else:
        sent = workload.timed(n, 1, lambda: transport.send(queue, next(messages)))
    sequences: list[int] = []

    def take() -> None:
        if bypass:
            received = transport._receive(queue, 1, None)
        else:
            received = transport.receive(queue, 1)
        sequences.extend(workload.sequence_of(message.body) for message in received)

    taken = workload.timed(n, 1, take)
    workload.check_exactly_once(sequences, range(n), f"instrumentation {queue}")
    return [("send 1/txn, instrumentation", sent), ("receive 1/call, instrumentation", taken)]
