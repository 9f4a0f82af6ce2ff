"""How long a ``sqlqueue`` command takes to start: ``--help`` and ``peek``, beside ``python``.

Each round starts four processes, ``python -c pass`` (the interpreter alone, which nothing in
this package can make faster), ``python -c "import sqlqueue_orm.transport"`` (what any command
that reaches a database imports: SQLAlchemy and the transport, the floor of ``peek``),
``sqlqueue --help`` and ``sqlqueue peek QUEUE`` on the run's database (one message waiting), in
an order that alternates from round to round, so a machine busy with something else slows all
alike. Printed: the median wall time of each (p50; the slowest as p99), its ratio to ``python
-c pass`` in the same rounds, and the median CPU time the process used (steadier than the wall
time when other work shares the machine). The targets: ``--help`` under 0.3 s, ``peek`` on
SQLite under 0.4 s.

The processes keep their bytecode, as an installed package does (the installer compiles its
modules): each run writes it once into a temporary directory (``PYTHONPYCACHEPREFIX``, with
``PYTHONDONTWRITEBYTECODE`` removed from the processes' environment) in a warm-up round that is
not counted, for every side alike, ``python -c pass`` and both checkouts of ``--against``. An
environment that compiles every module at every start (``PYTHONDONTWRITEBYTECODE=1`` with an
editable install) times the compiler, which no user of an installed package runs.

Usage: ``python -m benchmarks.bench_cli [--rounds 15] [--against CHECKOUT]`` (SQLite):
``--against`` times the commands of another checkout of the package in the same rounds, before
and after a change. Also the scenario ``cli`` of ``python -m benchmarks``
(:func:`startup_scenario`), on each of its databases.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks import servers, workload
from benchmarks.workload import Result
from sqlqueue_orm import OutgoingMessage, Transport

if TYPE_CHECKING:
    from benchmarks.harness import Run

#: Rounds of ``python -m benchmarks.bench_cli`` (``python -m benchmarks``: ``--cli-rounds``).
ROUNDS = 15
#: The targets, in seconds, by command.
TARGETS = {"--help": 0.3, "peek": 0.4}
#: The side every other is divided by.
BASELINE = "python -c pass"
#: The import every command that reaches a database makes.
TRANSPORT_IMPORT = "python -c 'import sqlqueue_orm.transport'"
#: The checkout whose package the commands run (this one).
HERE = Path(__file__).resolve().parent.parent
QUEUE = "bench_cli"


@dataclasses.dataclass(frozen=True)
class Command:
    """One side's process: its arguments, run in *checkout* with only that checkout's package.

    ``python -m`` puts the working directory first on the path, so the process runs there. With
    *bytecode*, the process reads and writes its compiled modules there (see the module's
    docstring); without, it inherits the environment's rule.
    """

    args: list[str]
    checkout: Path = HERE
    bytecode: Path | None = None

    def run(self) -> tuple[float, float]:
        """Seconds the process took, start to exit, and the CPU seconds it used; raise if it
        failed. The CPU time moves less than the wall time on a machine shared with other work.
        """
        env = {**os.environ, "PYTHONPATH": str(self.checkout)}
        if self.bytecode is not None:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(self.bytecode)
        used = _children_cpu()
        began = time.perf_counter()
        completed = subprocess.run(
            self.args, env=env, cwd=self.checkout, capture_output=True, text=True, check=False
        )
        seconds = time.perf_counter() - began
        if completed.returncode != 0:
            raise RuntimeError(f"{self.args}: exit {completed.returncode}: {completed.stderr}")
        return seconds, _children_cpu() - used


def _children_cpu() -> float:
    """User and system CPU seconds of this process's children that have exited."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def commands(url: str, bytecode: Path, checkout: Path = HERE) -> dict[str, Command]:
    """Each command of a round, by its side's name.

    :param bytecode: the directory the processes keep their compiled modules in.
    :param checkout: the directory whose ``sqlqueue_orm`` the commands import.
    """
    python, sqlqueue = [sys.executable, "-c"], [sys.executable, "-m", "sqlqueue_orm.cli"]
    return {
        BASELINE: Command([*python, "pass"], checkout, bytecode),
        TRANSPORT_IMPORT: Command([*python, "import sqlqueue_orm.transport"], checkout, bytecode),
        "sqlqueue --help": Command([*sqlqueue, "--help"], checkout, bytecode),
        "sqlqueue peek": Command([*sqlqueue, "--url", url, "peek", QUEUE], checkout, bytecode),
    }


def time_rounds(
    sides: dict[str, Command], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds of each side's command, one per round, the order alternating.

    A warm-up round before them, not counted, writes each side's bytecode.
    """
    names = list(sides)
    for name in names:
        sides[name].run()
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            wall, cpu = sides[name].run()
            walls[name].append(wall)
            cpus[name].append(cpu)
    return walls, cpus


def prepare(url: str) -> None:
    """The queue ``peek`` counts, with one message waiting."""
    with Transport(url) as transport:
        transport.create_queue(QUEUE)
        transport.purge_all(QUEUE)
        transport.send(QUEUE, OutgoingMessage(b"x"))


def startup_scenario(run: Run) -> None:
    """``sqlqueue --help`` and ``sqlqueue peek`` beside ``python -c pass``, alternating."""
    rounds = run.settings.cli_rounds
    prepare(run.database.url)
    with servers.temporary_directory() as bytecode:
        times, cpus = time_rounds(commands(run.database.url, Path(bytecode)), rounds)
    baseline = statistics.median(times[BASELINE])
    for side, found in times.items():
        median = statistics.median(found)
        cpu = statistics.median(cpus[side])
        result = Result.of(
            run.database.name,
            "CLI start-up, one process",
            side if side.startswith("python") else f"sqlqueue_orm: {side}",
            workload.Timing(len(found), sum(found), found),
            note=(f"rate = processes/s; median of {rounds} alternating rounds after a warm-up, "
                  f"bytecode kept; CPU {cpu:.3f} s"),
        )
        target = TARGETS.get(side.split()[-1])
        if target is not None and (side.endswith("--help") or run.database.name == "sqlite"):
            result = result.aiming(
                f"target: < {target:.1f} s",
                f"{median:.3f} s, {median / baseline:.1f}x {BASELINE}",
                median < target,
            )
        run.add(result)


def main(argv: list[str] | None = None) -> None:
    """Time the commands on a SQLite file and print the medians."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cli", description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="another checkout whose commands run in the same rounds")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be at least 1")
    with servers.temporary_directory() as directory:
        database = servers.sqlite(directory)
        prepare(database.url)
        bytecode = Path(directory) / "bytecode"
        sides = commands(database.url, bytecode)
        if args.against is not None:
            for name, command in commands(database.url, bytecode, args.against.resolve()).items():
                if name != BASELINE:
                    sides[f"{name} ({args.against})"] = command
        times, cpus = time_rounds(sides, args.rounds)
    baseline = statistics.median(times[BASELINE])
    print(f"{database.label}: {args.rounds} rounds, alternating, after a warm-up, bytecode kept; "
          f"load {os.getloadavg()}")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"  {name:58} median {median:.3f} s  slowest {max(found):.3f} s  "
              f"{median / baseline:5.1f}x {BASELINE}  CPU {statistics.median(cpus[name]):.3f} s")


if __name__ == "__main__":
    main()
