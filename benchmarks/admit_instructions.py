"""Instructions per SQLite admission under valgrind's callgrind: ours against raw, load-proof.

    .venv/bin/python benchmarks/admit_instructions.py [--admissions 1500] [--cycles 150]
        [--rounds 2] [--trees new=src,old=/tmp/old/src] [--kinds raw,ours] [--functions 0]

Wall and CPU times on a machine shared with other work move by a factor of two between runs minutes
apart; an instruction count does not. Each measured process runs under
``valgrind --tool=callgrind --instr-atstart=no``: it builds its admitter (``Ledger.admit(1)``,
"ours", or the raw transaction of ``_raw_admission.py``, "raw"; "raw + audit" adds the
audit row ``Ledger.admit`` writes, docs/decisions/032), admits a few hundred times
uninstrumented to warm up, and only then is instrumentation switched on from outside
(``callgrind_control -i on``) while it waits, and off again after the measured part.
Two parts, each process on a fresh copy of one ledger (4 tenants, 3 pools, 20,000
waiting, roomy quotas: ``admit.py``'s throughput setup):

``steady``: ``--admissions`` admissions in a row, nobody else writing (one admitting
process's steady state).

``stale``: ``--cycles`` times, this parent process commits a pool cap change through its
own connection (natively: not counted) and the measured process then admits ``--after``
times (4):
what the lock changing hands costs (docs/decisions/058), as the first admissions after
another connection's commit pay it with several admitting processes.

Printed per kind and tree: instructions per admission, split by where they ran
(libsqlite3, the Python interpreter and its extension modules, libc and the rest), and
with ``--functions N`` the N functions with the most instructions of each process (self
cost). Kernel work (the reads of pages SQLite fetches again) is not counted by valgrind.
``--trees`` runs each tree's ``src`` first on ``PYTHONPATH`` ("before" against "after").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from _databases import throwaway_database
from admit import ROOMY, TENANTS, bulk_insert, configure, waiting_rows
from quotagate.cli.common import render_table
from quotagate.store.engine import create_engine

_HERE = Path(__file__).resolve().parent
_WARM_UP = 300
_NEVER = float("inf")


def _admitter(url: str, kind: str) -> Callable[[], int]:
    if kind == "ours":
        from quotagate.store.ledger import Ledger

        # No expiry pass: once a second of the clock it costs some 0.7 ms of CPU, under 0.1 %
        # of a second's admissions, but valgrind runs the process 50-150 times slower, so
        # it would run that much more often, and more with --simulate than without.
        ledger = Ledger(create_engine(url), expiry_every=_NEVER)
        return lambda: len(ledger.admit(1))
    from _raw_admission import RawAdmission

    raw = RawAdmission(url, TENANTS, audit=kind == "raw + audit")
    return raw.admit_one


def child(url: str, kind: str, admissions: int, cycles: int, after: int) -> None:
    """The measured process: warm up, then admit as the parent says, line by line."""
    admit = _admitter(url, kind)
    for _ in range(_WARM_UP):
        admit()
    print("ready", flush=True)
    sys.stdin.readline()  # instrumentation is switched on meanwhile
    if cycles:
        for _ in range(cycles):
            sys.stdin.readline()  # the parent committed
            admitted = sum(admit() for _ in range(after))
            print(admitted, flush=True)
    else:
        admitted = sum(admit() for _ in range(admissions))
        print(admitted, flush=True)
    sys.stdin.readline()  # switched off meanwhile


def _object_kind(name: str) -> str:
    base = os.path.basename(name)
    if "sqlite3" in base and "_sqlite3" not in base:
        return "libsqlite3"
    if "python" in base:  # the interpreter, and extension modules (_sqlite3.cpython-…)
        return "Python"
    return "libc and the rest"


def costs(path: Path) -> tuple[list[str], dict[str, list[int]], dict[str, list[int]]]:
    """Self costs of a callgrind output file: its event names, and each event's count by
    object kind and by function."""
    events: list[str] = ["Ir"]
    by_object: dict[str, list[int]] = {}
    by_function: dict[str, list[int]] = {}
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    current = {"ob": "?", "fn": "?"}
    skip_next = False
    compressed = re.compile(r"\((\d+)\)(?: (.*))?")

    def name_of(kind: str, value: str) -> str:
        match = compressed.fullmatch(value)
        if match is None:
            return value
        number, text = match.groups()
        if text is not None:
            names[kind][number] = text
            return text
        return names[kind].get(number, value)

    def add(table: dict[str, list[int]], key: str, values: list[int]) -> None:
        total = table.setdefault(key, [0] * len(events))
        for index, value in enumerate(values):
            total[index] += value

    with path.open() as lines:
        for line in lines:
            if line[0].isdigit() or line[0] in "+-*":
                if skip_next:  # a call's inclusive cost, not the caller's own
                    skip_next = False
                    continue
                values = [int(field) for field in line.split()[1:]]
                add(by_object, _object_kind(current["ob"]), values)
                add(by_function, f"{current['fn']} [{os.path.basename(current['ob'])}]", values)
                continue
            if line.startswith("events:"):
                events = line.split()[1:]
                continue
            key, _, value = line.rstrip("\n").partition("=")
            if key in ("ob", "fn"):
                current[key] = name_of(key, value)
            elif key in ("cob", "cfn"):
                name_of(key[1:], value)
            elif key == "calls":
                skip_next = True
    return events, by_object, by_function


def measure(url: str, kind: str, tree: str, admissions: int, cycles: int, output: Path,
            *, simulate: bool, after: int = 4) -> tuple[int, list[str], dict[str, list[int]],
                                        dict[str, list[int]]]:
    """Run one measured process; return its admissions and its costs (:func:`costs`)."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(_HERE)]))
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no",
               f"--callgrind-out-file={output}"]
    if simulate:
        command += ["--cache-sim=yes", "--branch-sim=yes"]
    command += [sys.executable, str(Path(__file__).resolve()),
                "--child", url, kind, str(admissions), str(cycles), str(after)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=environment)
    assert process.stdin is not None and process.stdout is not None

    def say(line: str) -> None:
        assert process.stdin is not None
        process.stdin.write(line + "\n")
        process.stdin.flush()

    try:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind}: the measured process did not start")
        subprocess.run(["callgrind_control", "-i", "on", str(process.pid)], check=True,
                       capture_output=True)
        say("go")
        admitted = 0
        if cycles:
            other = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None,
                                    timeout=30)
            for _ in range(cycles):
                other.execute("BEGIN IMMEDIATE")
                other.execute("UPDATE qg_pool_capacity SET cap = cap + 1"
                              " WHERE pool = 'pool-3' AND resource = 'cpu'")
                other.execute("COMMIT")
                say("")
                admitted += int(process.stdout.readline())
            other.close()
        else:
            admitted = int(process.stdout.readline())
        subprocess.run(["callgrind_control", "-i", "off", str(process.pid)], check=True,
                       capture_output=True)
        say("")
        process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    return admitted, *costs(output)


# What the cache and branch simulation adds, each a sum of callgrind's events.
_SIMULATED = {
    "L1 instruction misses": ("I1mr",),
    "L1 data misses": ("D1mr", "D1mw"),
    "last-level misses": ("ILmr", "DLmr", "DLmw"),
    "mispredicted branches": ("Bcm", "Bim"),
}
_OBJECTS = ("libsqlite3", "Python", "libc and the rest")


def _per_admission(values: list[int], events: list[str], names: Sequence[str],
                   count: int) -> float:
    return sum(values[events.index(name)] for name in names if name in events) / count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=1500)
    parser.add_argument("--cycles", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--parts", default="steady,stale")
    parser.add_argument("--kinds", default="raw,raw + audit,ours")
    parser.add_argument("--trees", default=f"this={_HERE.parent / 'src'}",
                        help="comma-separated name=path of a src directory, run in turn")
    parser.add_argument("--simulate", action="store_true",
                        help="also simulate caches and branch prediction (slower)")
    parser.add_argument("--functions", type=int, default=0,
                        help="also print the top N functions of each process by instructions")
    parser.add_argument("--after", type=int, default=4,
                        help="admissions after each foreign commit (part stale)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        url, kind, admissions, cycles, after = arguments.child
        child(url, kind, int(admissions), int(cycles), int(after))
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("needs valgrind (callgrind and callgrind_control) on PATH")
    trees = [tuple(part.split("=", 1)) for part in arguments.trees.split(",")]
    kinds = arguments.kinds.split(",")
    parts = arguments.parts.split(",")
    columns = ["part", "kind", "tree", "admitted", "instructions/admission", *_OBJECTS]
    simulated_columns = ["part", "kind", "tree", *_SIMULATED, "of which Python's"]
    rows: list[list[str]] = []
    simulated: list[list[str]] = []
    tops: list[tuple[str, list[str], dict[str, list[int]], int]] = []
    with throwaway_database("sqlite") as template_url, \
            tempfile.TemporaryDirectory(prefix="quotagate-callgrind-") as scratch:
        engine = create_engine(template_url)
        configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
        bulk_insert(engine, waiting_rows(20_000, TENANTS, prefix="ci", start=time.time() - 600,
                                         span=300, priority=0))
        engine.dispose()
        template = Path(template_url.removeprefix("sqlite:///"))
        for round_number in range(arguments.rounds):
            for part in parts:
                order = [(kind, tree) for kind in kinds for tree in trees]
                if round_number % 2:
                    order.reverse()  # a b, then b a
                for kind, (tree_name, tree) in order:
                    copy = Path(scratch) / f"ledger-{round_number}-{part}.db"
                    shutil.copyfile(template, copy)
                    for suffix in ("-wal", "-shm"):
                        Path(f"{copy}{suffix}").unlink(missing_ok=True)
                    cycles = arguments.cycles if part == "stale" else 0
                    output = Path(scratch) / f"callgrind-{round_number}-{part}-{kind}-{tree_name}"
                    admitted, events, by_object, by_function = measure(
                        f"sqlite:///{copy}", kind, tree, arguments.admissions, cycles, output,
                        simulate=arguments.simulate, after=arguments.after)
                    count = max(admitted, 1)
                    zero = [0] * len(events)
                    total = sum(values[0] for values in by_object.values())
                    rows.append([part, kind, tree_name, f"{admitted:,}", f"{total / count:,.0f}",
                                 *(f"{by_object.get(name, zero)[0] / count:,.0f}"
                                   for name in _OBJECTS)])
                    print("  " + "  ".join(rows[-1]), flush=True)
                    if arguments.simulate:
                        summed = [sum(column) for column in zip(*by_object.values(), strict=True)]
                        python = by_object.get("Python", zero)
                        simulated.append([part, kind, tree_name, *(
                            f"{_per_admission(summed, events, names, count):,.0f}"
                            for names in _SIMULATED.values()), " / ".join(
                            f"{_per_admission(python, events, names, count):,.0f}"
                            for names in _SIMULATED.values())])
                    if arguments.functions:
                        tops.append((f"{part}, {kind}, {tree_name}", events, by_function, count))
    print("Instructions per admission (self, by where they ran)")
    print(render_table(columns, rows))
    if simulated:
        print("\nSimulated cache misses and mispredicted branches per admission")
        print(render_table(simulated_columns, simulated))
    for title, _events, by_function, count in tops:
        print(f"\n{title}: instructions per admission by function (self)")
        ranked = sorted(by_function.items(), key=lambda item: -item[1][0])
        print(render_table(["function", "instructions"], [
            [name, f"{values[0] / count:,.0f}"] for name, values in ranked[:arguments.functions]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
