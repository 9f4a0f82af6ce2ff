"""What a new user reads: plain-text help, what MODULE:ENDPOINT is, a ``run --once`` summary in
messages (not attempts) that says how many wait for a delayed retry, and errors that name the
option typed (``--batch``), not a Python parameter (``batch_size``)."""

from __future__ import annotations

import re

from sqlqueue_orm import OutgoingMessage
from tests.conftest import only
from tests.endpoint_app import Job
from tests.integration.cli_process import one_line, sqlqueue

#: reStructuredText a terminal would show as is: ``literal``, :class:`X`, :func:`f`.
MARKUP = re.compile(r"``|:[a-z]+:`")


def test_help_is_plain_text_and_names_what_module_endpoint_is(tmp_path):
    top = sqlqueue("--help", cwd=tmp_path)
    assert top.returncode == 0
    assert not MARKUP.search(top.stdout), top.stdout
    run = sqlqueue("run", "--help", cwd=tmp_path)
    assert not MARKUP.search(run.stdout), run.stdout
    text = " ".join(run.stdout.split())
    assert "module path" in text and "the name of an Endpoint object in it" in text


@only("sqlite", "postgresql")
def test_run_once_counts_messages_and_those_waiting_for_a_delayed_retry(database, tmp_path):
    transport = database.transport()
    transport.create_queue("jobs")
    transport.send_many("jobs", [
        OutgoingMessage(Job(number=n, fail=n >= 3)) for n in range(5)
    ])
    result = sqlqueue(
        "--url", database.url, "run", "tests.run_summary_app:endpoint", "--once", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    # 3 handled; 2 failed three times each (1 + 2 immediate retries), then wait an hour
    assert line.startswith("queue jobs: 5 message(s) in "), line
    assert line.endswith(
        "handled 3, failed 0, waiting for a delayed retry 2, expired 0, poison 0 "
        "(9 receive(s), 4 of them immediate retries)"
    ), line


@only("sqlite")
def test_errors_and_warnings_name_the_option_typed(database, tmp_path):
    url = ("--url", database.url)
    ingest = sqlqueue(*url, "spark", "ingest", "--queue", "audit", "--path",
                      str(tmp_path / "data"), "--batch", "2000000", cwd=tmp_path)
    assert ingest.returncode == 2
    line = one_line(ingest.stderr)
    assert "--batch" in line and "'2000000'" in line and "batch_size" not in line, line
    cleanup = sqlqueue(*url, "outbox", "cleanup", "--older-than", "soon", cwd=tmp_path)
    assert cleanup.returncode == 2
    assert "--older-than" in one_line(cleanup.stderr)
    migrated = sqlqueue(*url, "migrate", cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    dispatch = sqlqueue(*url, "outbox", "dispatch", "--once", "--batch", "5000", cwd=tmp_path)
    assert dispatch.returncode == 0, dispatch.stderr
    assert "--batch 5000" in dispatch.stderr and "batch_size" not in dispatch.stderr
    cleaned = sqlqueue(*url, "outbox", "cleanup", "--batch", "9000", cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "--batch 9000" in cleaned.stderr and "batch_size" not in cleaned.stderr
