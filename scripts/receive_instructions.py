"""Client instructions per received message, ours against the raw driver, counted by callgrind.

    python scripts/receive_instructions.py [--messages 1000] [--sides raw,begin,engine,...]

Wall-clock and CPU-time ratios move with whatever else the machine does; the number of
instructions the client process executes per message does not. For each side this runs a
child Python process under ``valgrind --tool=callgrind`` with instrumentation off, fills a
PostgreSQL queue, warms the side up, switches instrumentation on (``callgrind_control -i on``)
for exactly ``--messages`` receives of one message each, and reads the count callgrind
collected. The server's work is not counted (it is the same on both sides). Sides:

* ``raw``: ``baselines.RawQueue.receive``: the driver's BEGIN, our DELETE ... RETURNING, the
  headers parsed by ``json.loads``, COMMIT (the benchmark's ``raw BEGIN/stmt/COMMIT``);
* ``begin``: ``with transport.begin() as c: transport.receive(q, connection=c)``;
* ``engine``: the same in ``engine.begin()`` (the caller's own transaction);
* ``none``: ``transport.receive(q)`` (no ``connection=``: at most once, autocommit);
* ``raw10``, ``begin10``: ten per transaction (counts per message).

Needs valgrind (``apt-get install valgrind``); PostgreSQL from ``$SQLQUEUE_BENCH_POSTGRES_URL``
or a throwaway cluster.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIDES = ("raw", "begin", "engine", "none", "raw10", "begin10")


def _child(url: str, side: str, count: int) -> None:
    """Run in the child under callgrind: *count* receives of *side*, instrumented."""
    from benchmarks import baselines, workload
    from benchmarks.servers import Database
    from sqlqueue_orm import Transport

    per = 10 if side.endswith("10") else 1
    transport = Transport(url)
    transport.create_queue("instructions")
    raw = baselines.RawQueue(Database("postgresql", url, "pg"), "instructions", autocommit=False)
    workload.warm_up(transport, "instructions")
    messages = workload.outgoing(0, per * (count + 4))
    for start in range(0, len(messages), 500):
        transport.send_many("instructions", messages[start : start + 500])

    def receive() -> int:
        if side.startswith("raw"):
            return len(raw.receive(per))
        if side == "none":
            return len(transport.receive("instructions", per))
        begin = transport.begin if side.startswith("begin") else transport.engine.begin
        with begin() as connection:
            return len(transport.receive("instructions", per, connection=connection))

    for _ in range(4):  # warm: the statements prepared, the kept connection taken
        receive()
    switch = [_tool("callgrind_control"), "-i"]
    subprocess.run([*switch, "on", str(os.getpid())], check=True, capture_output=True)  # noqa: S603  (our own arguments)
    got = sum(receive() for _ in range(count))
    subprocess.run([*switch, "off", str(os.getpid())], check=True, capture_output=True)  # noqa: S603
    if got != per * count:
        raise SystemExit(f"{side}: received {got} of {per * count}")
    raw.close()
    transport.close()


def _count(url: str, side: str, count: int) -> float:
    """Instructions per message of *side*, from a child run under callgrind."""
    with tempfile.TemporaryDirectory() as directory:
        done = subprocess.run(  # noqa: S603  (our own arguments)
            [_tool("valgrind"), "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={directory}/out", sys.executable, __file__, "--child",
             url, side, str(count)],
            capture_output=True, text=True, check=False,
        )
    match = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"{side}: {done.stderr[-2000:]}")
    per = 10 if side.endswith("10") else 1
    return int(match.group(1)) / (count * per)


def _tool(name: str) -> str:
    """The path of valgrind's *name*; exit 2 naming it when it is not installed."""
    path = shutil.which(name)
    if path is None:
        print(f"{name} not found: apt-get install valgrind", file=sys.stderr)
        raise SystemExit(2)
    return path


def main() -> None:
    """Count each side's instructions per message and print the table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--sides", default=",".join(SIDES))
    arguments = parser.parse_args()
    sides = [side for side in arguments.sides.split(",") if side]
    unknown = [side for side in sides if side not in SIDES]
    if unknown or arguments.messages < 1:
        parser.error(f"unknown side {unknown[0]!r}" if unknown else "--messages must be >= 1")
    from benchmarks import servers

    url = servers.postgresql().url
    counts = {side: _count(url, side, arguments.messages) for side in sides}
    print("| side | instructions per message | raw ÷ side |")
    print("|---|---:|---:|")
    for side, value in counts.items():
        baseline = counts.get("raw10" if side.endswith("10") else "raw")
        ratio = f"{baseline / value:.3f}" if baseline else ""
        print(f"| {side} | {value:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
