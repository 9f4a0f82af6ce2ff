"""A handler whose work would never run is refused, or fails its message: never "handled".

Handlers run synchronously. An ``async def`` handler (or a callable whose ``__call__`` is one,
or a ``functools.partial`` of either) is refused when registered; a handler that returns an
awaitable anyway fails its message, which goes through its retries to the error queue.
"""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import warnings

import pytest

from sqlqueue_orm import OutgoingMessage, exceptions, headers
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.endpoint_app import Job
from tests.integration.test_endpoint_transaction_modes import run_until


async def coroutine_handler(job: Job, context: HandlerContext) -> None:
    """Never runs: calling it only makes a coroutine."""


async def async_generator_handler(job: Job, context: HandlerContext):  # type: ignore[no-untyped-def]
    """Never runs: calling it only makes an async generator."""
    yield None


class AsyncCallable:
    """An object whose ``__call__`` is a coroutine function."""

    async def __call__(self, job: Job, context: HandlerContext) -> None:
        """Never runs."""


ASYNC_HANDLERS = {
    "async def": (coroutine_handler, "coroutine_handler"),
    "async generator": (async_generator_handler, "async_generator_handler"),
    "async __call__": (AsyncCallable(), "AsyncCallable"),
    "partial": (functools.partial(coroutine_handler), "coroutine_handler"),
    "partial of async __call__": (functools.partial(AsyncCallable()), "AsyncCallable"),
}


@pytest.mark.parametrize("kind", list(ASYNC_HANDLERS))
def test_an_async_handler_is_refused_at_registration_naming_it(database, kind):
    transport = database.transport()
    endpoint = Endpoint("inbox", transport)
    handler, name = ASYNC_HANDLERS[kind]
    with pytest.raises(exceptions.ConfigurationError, match=name):
        endpoint.handle(Job, handler)
    with pytest.raises(exceptions.ConfigurationError, match=name):
        endpoint.handle_raw(handler)


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
@pytest.mark.parametrize(
    "mode", [TransactionMode.TRANSACTION_SCOPE, TransactionMode.NONE], ids=lambda m: m.name
)
def test_a_handler_returning_a_coroutine_fails_its_message_to_the_error_queue(
    database, mode, raw
):
    transport = database.transport()
    transport.create_queue("inbox")
    sent = transport.send("inbox", OutgoingMessage(Job(number=1)))
    settings = EndpointSettings(
        concurrency=1, transaction_mode=mode, peek_delay=0.1, immediate_retries=2,
        delayed_retries=0,
    )
    endpoint = Endpoint("inbox", transport, settings=settings)
    calls: list[str] = []

    async def work() -> None:
        calls.append("ran")  # never: the coroutine is closed, not awaited

    def returns_coroutine(_: object, context: HandlerContext):  # type: ignore[no-untyped-def]
        calls.append(context.message_id)
        return work()

    if raw:
        endpoint.handle_raw(returns_coroutine)
    else:
        endpoint.handle(Job, returns_coroutine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_until(endpoint, lambda: endpoint.stats.failed + endpoint.stats.handled >= 1)
        gc.collect()
    assert endpoint.stats.handled == 0
    # the first try and two immediate retries (NONE took the message off its queue: no retry)
    assert calls == [sent] * (1 if mode is TransactionMode.NONE else 3)
    assert transport.peek("inbox") == 0
    [moved] = transport.receive("error", 10)
    assert moved.message_id == sent
    assert moved.headers[headers.EXCEPTION_TYPE].endswith("TypeError")
    assert "returns_coroutine returned an awaitable" in moved.headers[headers.EXCEPTION_MESSAGE]
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_sqlqueue_run_refuses_an_async_handler_in_one_line_naming_it(database, tmp_path):
    database.transport().create_queue("inbox")
    (tmp_path / "async_app.py").write_text(
        "import os\n"
        "from sqlqueue_orm import Transport, db\n"
        "from sqlqueue_orm.receiving import Endpoint\n"
        "endpoint = Endpoint('inbox', Transport(db.create_engine(os.environ['SQLQUEUE_URL'])))\n"
        "@endpoint.handle_raw\n"
        "async def on_message(body, context):\n"
        "    pass\n"
    )
    env = {**os.environ, "SQLQUEUE_URL": database.url}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", "run", "async_app:endpoint", "--once"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "on_message is asynchronous" in line and "Traceback" not in result.stderr
