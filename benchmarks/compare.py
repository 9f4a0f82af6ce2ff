"""Side by side: :mod:`benchmarks.cpu_cost` with another checkout's library, in alternating runs.

On a shared machine two runs made minutes apart are not comparable; runs alternated are. Each
run is a process of its own running this tree's ``benchmarks.cpu_cost`` (so both sides are
measured against the very same raw loops), importing ``sqlqueue_orm`` from *--before* or from
this tree, turn about. Printed per database and path: the median over the runs of each side's
µs of process time per message, ours and ours - raw.

``python -m benchmarks.compare --before /path/to/checkout [--runs 3] [--rounds 5]
[--databases sqlite] [--messages 3000]``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: This tree (its ``benchmarks`` and ``sqlqueue_orm``).
HERE = Path(__file__).resolve().parent.parent
#: A line of cpu_cost's table: ours, its figure, the raw side, its figure, ours - raw.
_LINE = re.compile(r"^  (\S.*?)\s+(-?[\d.]+)\s+(\S.*?)\s+(-?[\d.]+)\s+ours - raw\s+(-?[\d.]+)$")


def run(library: Path, benchmarks: Path, args: argparse.Namespace) -> dict[tuple[str, str], float]:
    """One cpu_cost process with ``sqlqueue_orm`` from *library*: (database, path) -> figures."""
    paths = [str(benchmarks), str(library), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    command = [sys.executable, "-m", "benchmarks.cpu_cost", "--rounds", str(args.rounds),
               "--messages", str(args.messages), "--databases", args.databases]
    output = subprocess.run(command, env=env, cwd=benchmarks, capture_output=True, text=True,
                            check=True).stdout
    found: dict[tuple[str, str], float] = {}
    database = ""
    for line in output.splitlines():
        if line and not line.startswith(" "):
            database = line.split(" (")[0].split(":")[0]
        match = _LINE.match(line)
        if match:
            found[(database, match[1] + " (ours)")] = float(match[2])
            found[(database, match[1] + " - raw")] = float(match[5])
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare")
    parser.add_argument("--before", type=Path, required=True,
                        help="a checkout whose sqlqueue_orm (and tests/) to measure")
    parser.add_argument("--runs", type=int, default=3, help="processes of each side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--databases", default="sqlite")
    args = parser.parse_args(argv)
    sides: dict[str, list[dict[tuple[str, str], float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as directory:
        # This tree's benchmarks alone, so that sqlqueue_orm comes from the side's library.
        benchmarks = Path(directory)
        (benchmarks / "benchmarks").symlink_to(HERE / "benchmarks")
        for number in range(args.runs):
            for side, library in (("before", args.before.resolve()), ("after", HERE)):
                print(f"run {number + 1} of {args.runs}: {side}", file=sys.stderr)
                sides[side].append(run(library, benchmarks, args))
    keys = [key for key in sides["after"][0] if all(key in found for found in sides["before"])]
    print(f"µs of process time per message, median of {args.runs} alternating runs per side")
    print(f"{'database':12} {'path':40} {'before':>8} {'after':>8} {'after - before':>15}")
    for database, path in keys:
        before = statistics.median(found[(database, path)] for found in sides["before"])
        after = statistics.median(found[(database, path)] for found in sides["after"])
        print(f"{database:12} {path:40} {before:8.1f} {after:8.1f} {after - before:15.1f}")


if __name__ == "__main__":
    main()
