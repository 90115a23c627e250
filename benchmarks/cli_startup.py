"""How long a ``quotagate`` command takes from exec to exit, next to the interpreter's floor.

Each command runs as a user runs it (a fresh process, the console script's import), on a
throwaway SQLite file. The raw baselines, measured in the same rounds: a bare ``python -c
pass`` and ``import click, sqlalchemy`` (what any SQLAlchemy CLI pays before its own code).
``--against REV`` adds the same commands on the code of a git revision (its ``src`` exported
to a temporary directory and put first on ``PYTHONPATH``), interleaved with ours.

Two ways to find the bytecode, each its own table: ``cached`` (``.pyc`` files written once, to a
temporary ``PYTHONPYCACHEPREFIX``, as an installed package has them) and ``compiled`` (with
``PYTHONDONTWRITEBYTECODE=1`` nothing is cached, so every run compiles quotagate's source
again: what an editable install gives when that variable is set, as in this project's sessions).

    .venv/bin/python benchmarks/cli_startup.py [--rounds 10] [--against main]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from quotagate.cli.common import render_table

ROOT = Path(__file__).resolve().parent.parent
RUN_CLI = "import sys; from quotagate.cli.main import main; sys.argv[0] = 'quotagate'; main()"
RAW = {
    "python -c pass": ["-c", "pass"],
    "import click, sqlalchemy": ["-c", "import click, sqlalchemy"],
}


def export_source(revision: str, into: Path) -> Path:
    """The ``src`` tree of ``revision``, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "src"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def timed(arguments: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run, in seconds.

    On a loaded machine the wall time mostly measures the queue for a core; the CPU
    time is the work the run did, and is what the ratios below are read from first.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, *arguments], check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--against", metavar="REV", default=None,
                        help="also time the commands on this git revision's code")
    parser.add_argument("--modes", default="cached,compiled", help="cached, compiled or both (comma-separated)")
    options = parser.parse_args()
    modes = options.modes.split(",")

    with tempfile.TemporaryDirectory(prefix="qg-cli-") as scratch:
        directory = Path(scratch)
        plain = {key: value for key, value in os.environ.items()
                 if key not in ("PYTHONPATH", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
        bytecode = {"cached": {"PYTHONPYCACHEPREFIX": str(directory / "pyc")},
                    "compiled": {"PYTHONDONTWRITEBYTECODE": "1"}}
        ours = {**plain, "QUOTAGATE_DB": f"sqlite:///{directory / 'ours.db'}"}
        codes = {"ours": ours}
        if options.against:
            old_source = export_source(options.against, directory / "old")
            codes[options.against] = {**ours, "QUOTAGATE_DB": f"sqlite:///{directory / 'old.db'}",
                                      "PYTHONPATH": str(old_source)}
        for env in codes.values():
            for setup in (["init"], ["tenant", "set", "team-a", "--quota", "gpu=1000000"],
                          ["pool", "set", "pool-1", "--capacity", "gpu=1000000"]):
                subprocess.run([sys.executable, "-c", RUN_CLI, *setup], check=True, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def commands(round_number: int) -> dict[str, list[str]]:
            return {
                "--help": ["--help"],
                "tenant list": ["tenant", "list"],
                "tenant show": ["tenant", "show", "team-a"],
                "submit": ["submit", "--id", f"job-{round_number}", "--tenant", "team-a", "--cost", "gpu=1"],
            }

        samples: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
        load_before = os.getloadavg()[0]
        started = time.strftime("%H:%M:%S", time.gmtime())
        for round_number in range(-1, options.rounds):  # round -1 warms the caches and the .pyc files
            for mode in modes:
                for name, arguments in RAW.items():
                    sample = timed(arguments, {**ours, **bytecode[mode]})
                    if round_number >= 0:
                        samples.setdefault((mode, "raw", name), []).append(sample)
                for name, arguments in commands(round_number).items():
                    for code, env in codes.items():
                        # A submit's id is new in each round and mode: every run records a request.
                        arguments = [f"{argument}-{mode}" if argument.startswith("job-") else argument
                                     for argument in arguments]
                        sample = timed(["-c", RUN_CLI, *arguments], {**env, **bytecode[mode]})
                        if round_number >= 0:
                            samples.setdefault((mode, code, name), []).append(sample)
        finished = time.strftime("%H:%M:%S", time.gmtime())
        load_after = os.getloadavg()[0]

    print(f"median of {options.rounds} interleaved runs, {started}-{finished} UTC, "
          f"load average {load_before:.1f} -> {load_after:.1f}")
    for mode in modes:
        def median_ms(code: str, name: str, which: int, mode: str = mode) -> float:
            return statistics.median(sample[which] for sample in samples[mode, code, name]) * 1000

        for which, kind in ((1, "CPU"), (0, "wall")):
            headers = [f"bytecode {mode}, {kind}", "ours ms"]
            if options.against:
                headers += [f"{options.against} ms", f"ours / {options.against}"]
            rows = [[f"raw: {name}", f"{median_ms('raw', name, which):.0f}"] + ([""] * 2 if options.against else [])
                    for name in RAW]
            for name in commands(0):
                ours_ms = median_ms("ours", name, which)
                row = [f"quotagate {name}", f"{ours_ms:.0f}"]
                if options.against:
                    old = median_ms(options.against, name, which)
                    row += [f"{old:.0f}", f"{ours_ms / old:.2f}"]
                rows.append(row)
            print()
            print(render_table(headers, rows))


if __name__ == "__main__":
    main()
