"""`make test`'s suites, one pytest session each, with each one's time at the end.

The main session holds the shared e2e app (unit, integration, e2e, chaos); the others start
clusters or engines of their own (three-node, `ray up`, whole apps started and stopped, the
capacity command's engine), so they cannot share its process. Most of them wait more than they
compute (a test engine, moves, restarts): measured on 2 cores, seven of them took 21 min of wall
time and 5.4 min of CPU. So they run in a lane beside the main session, one after another, each
on a Ray cluster of its own (dynamic GCS port, its own HTTP port; capacity needs none); their
output is printed after the main session's. `rayup` and `stop` run last and alone: `ray down`
and `ray stop --force` end every Ray process on the machine.

Each session gets MAKE_TEST_SUITE=<its name> (tests/own_processes.py), so a check that no engine
is left counts its own cluster's. The table is printed however the run ends; the exit status is
the first failing suite's. A failure ends its own lane (the lane goes on while main runs, and
main while the lane does); rayup and stop start only when every suite before them passed.
Under the table, each failed test with its error's first line: a CI log cut to its tail still
names every failure, the main session's too (its output comes before the lane's).

    python tests/suites.py            # all: main beside the lane, then the suites that run alone
    python tests/suites.py NAME ...   # the named ones, one after another
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [str(ROOT / ".venv" / "bin" / "pytest"), "-q"]
SUITE_VARIABLE = "MAKE_TEST_SUITE"  # tests/own_processes.py reads it
# Monitoring first: its real engine then overlaps the main session's unit and integration
# tests, not the shared app's five engines (memory is the limit: 24 GiB here, 2.3-3.3 GB left
# at the lowest with test-engine suites beside the shared app, docs/benchmarks.md).
# Capacity (one engine of its own, no Ray) last: the lane ended about six minutes before main.
BESIDE_MAIN = ("monitoring", "placement", "autoscale", "recovery", "batch", "capacity")
ALONE = ("rayup", "stop")
OWN_CLUSTERS = (*BESIDE_MAIN, *ALONE)
SUITES: dict[str, list[str]] = {
    "main": [
        "tests",
        "--durations=40",
        *(f"--ignore=tests/{name}" for name in OWN_CLUSTERS),
    ],
    **{name: [f"tests/{name}", "-s", "--durations=10"] for name in OWN_CLUSTERS},
}


@dataclass(frozen=True)
class Outcome:
    name: str
    seconds: float
    status: int
    failures: tuple[str, ...] = field(default=())


def run_suite(name: str, reports: Path, output: int | None = None) -> Outcome:
    """One pytest session, its JUnit report in `reports`; its output to `output` (a file
    descriptor), else to ours."""
    env = {**os.environ, SUITE_VARIABLE: name}
    report = reports / f"{name}.xml"
    started = time.monotonic()
    status = subprocess.run(
        [*PYTEST, *SUITES[name], f"--junitxml={report}"],
        cwd=ROOT,
        env=env,
        stdout=output,
        stderr=output,
        check=False,
    ).returncode
    return Outcome(name, time.monotonic() - started, status, failed_tests(report))


def failed_tests(report: Path) -> tuple[str, ...]:
    """`test id - first line of its error` for each failed or erred test in a JUnit report."""
    try:
        root = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        return ()
    failed = []
    for case in root.iter("testcase"):
        for problem in (*case.findall("failure"), *case.findall("error")):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            message = (problem.get("message") or "").strip().splitlines()
            failed.append(f"{test} - {message[0][:300] if message else problem.tag}")
    return tuple(failed)


def run_in_order(
    names: tuple[str, ...] | list[str],
    outcomes: list[Outcome],
    reports: Path,
    sink: TextIO | None = None,
) -> None:
    """`names` one after another, their output to `sink` (else ours); stops at a failure."""
    for name in names:
        if sink is not None:
            sink.write(f"\n===== {name} =====\n")
            sink.flush()
        outcomes.append(run_suite(name, reports, sink.fileno() if sink is not None else None))
        if outcomes[-1].status != 0:
            return


def run_all(outcomes: list[Outcome], reports: Path) -> None:
    lane: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="gps-suites-") as folder:
        log = Path(folder) / "lane.log"
        with log.open("w") as sink:
            beside = threading.Thread(
                target=run_in_order, args=(BESIDE_MAIN, lane, reports, sink), daemon=True
            )
            beside.start()
            try:
                outcomes.append(run_suite("main", reports))
                beside.join()
            finally:
                outcomes.extend(lane)
                print(f"\n===== the suites run beside main: {', '.join(BESIDE_MAIN)} =====")
                print(log.read_text(errors="replace"), flush=True)
    if all(o.status == 0 for o in outcomes) and len(outcomes) == 1 + len(BESIDE_MAIN):
        run_in_order(ALONE, outcomes, reports)


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown suites: {', '.join(unknown)}; known: {', '.join(SUITES)}")
        return 2
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gps-reports-") as folder:
        try:
            if names:
                run_in_order(names, outcomes, Path(folder))
            else:
                run_all(outcomes, Path(folder))
        finally:
            _report(outcomes, time.monotonic() - started, side_by_side=not names)
    return next((o.status for o in outcomes if o.status != 0), 0)


def _report(outcomes: list[Outcome], wall_s: float, side_by_side: bool) -> None:
    beside = f" ({', '.join(BESIDE_MAIN)} ran beside main)" if side_by_side else ""
    print(f"\nsuite times{beside}:")
    for o in outcomes:
        outcome = "ok" if o.status == 0 else f"FAILED ({o.status})"
        print(f"  {o.name:<11} {o.seconds / 60:6.1f} min  {outcome}")
    print(f"  {'wall':<11} {wall_s / 60:6.1f} min")
    for o in outcomes:
        for failure in o.failures:
            print(f"FAILED in {o.name}: {failure}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
