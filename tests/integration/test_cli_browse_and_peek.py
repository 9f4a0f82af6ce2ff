"""``sqlqueue browse`` shows the start of a long body with a marker saying how long it is and how
to see it all (``--full-body``); ``--json`` and ``receive`` always give the whole body, exactly.
``sqlqueue peek`` counts a queue of up to a thousand messages exactly.

Run in this process through ``cli.main`` (a subprocess costs a second or more on a busy machine).
"""

from __future__ import annotations

import base64
import json

from sqlqueue_orm import OutgoingMessage, cli

BIG = 1_000_000


def _run(capsys, url, *args):
    capsys.readouterr()
    assert cli.main(["--url", url, *args]) == 0
    return capsys.readouterr().out


def test_browse_shows_the_start_of_a_long_body_and_full_body_shows_it_all(database, capsys):
    transport = database.transport()
    transport.create_queue("orders")
    text = "order line; " * (BIG // 12)
    binary = bytes(range(256)) * (BIG // 256)
    transport.send("orders", OutgoingMessage(text, message_id="text"))
    transport.send("orders", OutgoingMessage(binary, message_id="binary"))
    transport.send("orders", OutgoingMessage(b"short", message_id="short"))
    url = database.url

    cut_text, cut_binary, short = _run(capsys, url, "browse", "orders").splitlines()
    for line, size in ((cut_text, len(text)), (cut_binary, len(binary))):
        assert len(line) < 400, line[:400]
        assert f"{size:,} bytes" in line and "--full-body" in line
    assert cut_text.startswith("text: order line; order line;")
    assert cut_binary.startswith("binary base64: " + base64.b64encode(binary[:60]).decode())
    assert short == "short: short"

    whole_text, whole_binary, short = _run(
        capsys, url, "browse", "orders", "--full-body").splitlines()
    assert whole_text == f"text: {text}"
    assert whole_binary == "binary base64: " + base64.b64encode(binary).decode()
    assert short == "short: short"

    records = [json.loads(line) for line in
               _run(capsys, url, "browse", "orders", "--json").splitlines()]
    assert records[0]["body"] == text
    assert base64.b64decode(records[1]["body_base64"]) == binary

    assert _run(capsys, url, "receive", "orders").splitlines() == [f"text: {text}"]


def test_peek_counts_exactly_a_queue_of_up_to_a_thousand_messages(database, capsys):
    transport = database.transport()
    transport.create_queue("orders")
    transport.send("orders", OutgoingMessage(b"a"))
    with transport.engine.connect() as connection:  # a send rolled back: a gap in RowVersion
        transport.send("orders", OutgoingMessage(b"rolled back"), connection=connection)
        connection.rollback()
    transport.send("orders", OutgoingMessage(b"c"))
    assert transport.peek("orders") >= 2  # the estimate: max - min RowVersion + 1
    assert _run(capsys, database.url, "peek", "orders") == "2\n"
    transport.send_many("orders", [OutgoingMessage(b"x") for _ in range(1_000)])
    # Beyond a thousand: the estimate, which costs the same at any depth.
    assert _run(capsys, database.url, "peek", "orders") == f"{transport.peek('orders')}\n"
