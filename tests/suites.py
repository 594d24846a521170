"""`make test`'s suites, one pytest session each, with each one's time at the end.

The tests that need no Ray (unit, integration, gpu) are one session, `no-ray`; the shared e2e
app's (e2e and chaos) are `main`; the others start clusters or engines of their own (three-node,
`ray up`, whole apps started and stopped, the capacity command's engine), so they cannot share
its process. Most of them wait more than they compute (a test engine, moves, restarts): measured
on 2 cores, seven of them took 21 min of wall time and 5.4 min of CPU. So they run in lanes,
one after another, beside a session that computes, in three phases:

1. `rayup` and `stop` beside `no-ray` and `capacity` (which start no Ray either): `ray down` and
   `ray stop --force` end every Ray process on the machine, so nothing else of Ray may run. In a
   lane of its own, `image-build` builds the CPU image (tests/image: podman, no Ray in it).
2. `placement` and `autoscale`, each on a Ray cluster of its own (dynamic GCS port, its own
   HTTP port), beside `main`.
3. `monitoring` (a real Prometheus over its own app held under KV pressure, then `make reload`
   swapping a model on that app: a second engine) beside `recovery` and then `batch`, and
   beside `image` and then `gcs`. The shared app's engines leave no memory for monitoring's
   app and engine (Ray's memory monitor killed workers of both apps at 95% of 24 GiB on an
   AVX2-only machine: clean-clone run of 7d5352f) nor for reload's second engine. Recovery
   starts four Ray nodes (a head, two pools, a replacement), and each node's raylet crashes
   when its dashboard agent does not write its port within Ray's fixed 15 s: beside the shared
   app at work its agents took 35-70 s, and its start failed all five tries (run of 1d8f684).
   Its engines are a test engine and llama.cpp, so memory allows it here. Batch starts its
   cluster twice (a restart is its subject): beside main on an AVX2-only machine that took it
   24.6 and 32.7 min (runs of a26378e and CI's of e176735) against 3-6 alone. It runs after
   recovery in one lane, so a recovery failure leaves it for the next run. `image` runs the
   image phase 1 built (one vLLM engine in a container, a few minutes): a container's
   processes are visible from here, and a `ray stop` would end its Ray, so not in phase 1;
   `gcs` (three Ray nodes of a test engine and llama.cpp, the GCS killed and the head
   replaced: light, but its node starts want a machine not as loaded as beside the shared
   app) follows it. Four lanes here, with reload a session and an app of its own, took CI's
   run of 0b7c2de past its 90 minutes, and the image's `make run` missed Ray's 30 s node
   registration (`make run` now waits as the tests do: cluster/ray_start.py).

A lane's output is printed after the phase's session's. Each session gets MAKE_TEST_SUITE=<its
name> (tests/own_processes.py), so a check that no engine is left counts its own cluster's, and
`ray stop`'s and `ray down`'s machine-wide checks skip the processes of the session beside them;
and MAKE_TEST_RUN=<this run's id>, which names the run's image (tests/image/conftest.py).
The table is printed however the run ends; the exit status is the first failing suite's. A
failure ends its own lane; the second phase runs whatever the first did, so one run names every
failure. Under the table, each failed test with its error's first line: a CI log cut to its tail
still names them all, with up to 12 more lines of each error.

    python -m tests.suites            # all: the three phases
    python -m tests.suites NAME ...   # the named ones, one after another

Beside each suite's wall time the table gives the CPU its processes used (tests/cpu_meter.py),
and under it the machine's busy time over the run: the suites share two cores, so what a suite
computes, not how long it waits, is what every suite beside it pays for.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

from tests.cpu_meter import CpuBySuite, machine_busy_s

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [str(ROOT / ".venv" / "bin" / "pytest"), "-q"]
SUITE_VARIABLE = "MAKE_TEST_SUITE"  # tests/own_processes.py reads it
# Phase 1: sessions that start no Ray, beside the suites that stop every Ray process here.
NO_RAY = ("no-ray", "capacity")
STOPPING_RAY = ("rayup", "stop")
BUILDING = ("image-build",)
# Phase 2, beside main.
BESIDE_MAIN = ("placement", "autoscale")
# Phase 3: monitoring (with reload's model swap, on its app) beside two lanes of suites that
# start Ray nodes of test engines and llama.cpp, and the image phase 1 built, run.
LAST = ("monitoring",)
BESIDE_LAST = ("recovery", "batch")
AFTER_IMAGE = ("gcs",)
RUNNING_IMAGE = ("image", *AFTER_IMAGE)
OWN_FOLDERS = ("capacity", *STOPPING_RAY, *BESIDE_MAIN, *LAST, *BESIDE_LAST, *AFTER_IMAGE)
SUITES: dict[str, list[str]] = {
    "no-ray": ["tests/unit", "tests/integration", "tests/gpu", "--durations=20"],
    "main": ["tests/e2e", "tests/chaos", "--durations=40"],
    **{name: [f"tests/{name}", "-s", "--durations=10"] for name in OWN_FOLDERS},
    "image-build": ["tests/image/test_build.py", "-s", "--durations=10"],
    "image": ["tests/image/test_cpu_image.py", "-s", "--durations=10"],
}
RUN_VARIABLE = "MAKE_TEST_RUN"  # tests/image/conftest.py
# A session's HAProxy ports are this far from the next session's: room for its cluster's nodes
# on this machine, each a port further (tests/local_ray.py, haproxy_ports_of_node).
NODES_PER_SESSION = 10


RUNNING: set[subprocess.Popen[bytes]] = set()  # the sessions under way, for pass_on
CPU = CpuBySuite()  # each session's processes' CPU, for the table


@dataclass(frozen=True)
class Outcome:
    name: str
    seconds: float
    status: int
    failures: tuple[str, ...] = field(default=())
    cpu_s: float = 0.0  # its processes' CPU, as far as CPU read it
    cpu_by_kind: tuple[tuple[str, float], ...] = ()  # the most first (tests/cpu_meter.py)


def run_suite(name: str, reports: Path, output: int | None = None) -> Outcome:
    """One pytest session, its JUnit report in `reports`; its output to `output` (a file
    descriptor), else to ours. It leads a session of its own, which its processes inherit
    (tests/own_processes.py tells them by it)."""
    env = {**os.environ, SUITE_VARIABLE: name, **haproxy_ports(name)}
    report = reports / f"{name}.xml"
    started = time.monotonic()
    session = subprocess.Popen(
        [*PYTEST, *SUITES[name], f"--junitxml={report}"],
        cwd=ROOT,
        env=env,
        stdout=output,
        stderr=output,
        start_new_session=True,
    )
    RUNNING.add(session)
    CPU.watch(session.pid, name)  # it leads its session: the session's id is its pid
    try:
        status = session.wait()
    finally:
        RUNNING.discard(session)
    seconds = time.monotonic() - started
    CPU.read_once()  # what its last interval added, of those of its processes still there
    return Outcome(
        name,
        seconds,
        status,
        failed_tests(report),
        cpu_s=CPU.seconds(name),
        cpu_by_kind=tuple(CPU.by_kind(name)),
    )


def haproxy_ports(name: str) -> dict[str, str]:
    """Under Serve's throughput mode (RAY_SERVE_ENABLE_HA_PROXY=1) every node runs an HAProxy
    whose metrics and stats ports are fixed per machine (9101, 8404): each session's clusters
    get their own, or the second to start dies binding them. Ports a run gave are the bases."""
    step = NODES_PER_SESSION * list(SUITES).index(name)
    bases = {"RAY_SERVE_HAPROXY_METRICS_PORT": 19101, "RAY_SERVE_HAPROXY_STATS_PORT": 18404}
    return {var: str(int(os.environ.get(var, base)) + step) for var, base in bases.items()}


def pass_on(signal_number: int, frame: FrameType | None) -> None:
    """Ctrl-C or a SIGTERM reaches the sessions too: in sessions of their own, they are out of
    the terminal's process group (and pytest ends its clusters on SIGINT)."""
    for session in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session.pid, signal.SIGINT)
    signal.default_int_handler(signal_number, frame)


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
            # What follows the first line (a fuzz test's failures, a status's body): the line
            # a CI log cut to its tail keeps is rarely enough to mend the test by. pytest cuts
            # the message attribute short ("[+14 more lines; ...]"): the error's own `E` lines
            # of the report's text are whole.
            more = error_lines(problem.text or "") or message[1:]
            more = [line.strip()[:300] for line in more[1:] if line.strip()]
            failed.extend(f"    {line}" for line in more[:MESSAGE_LINES])
            if len(more) > MESSAGE_LINES:
                failed.append(f"    ... {len(more) - MESSAGE_LINES} more lines")
            failed.extend(f"    {line}" for line in group_members(problem.text or ""))
    return tuple(failed)


MESSAGE_LINES = 12  # of each failure's message, under its first line
HEAVIEST, KINDS_SHOWN = 4, 6  # the suites whose CPU the table breaks down, and into how many


def error_lines(traceback: str) -> list[str]:
    """The lines pytest marks `E` in a failure's report (the error and its explanation), the
    last failure's only where an exception group has several."""
    return [line[1:].strip() for line in traceback.splitlines() if line.startswith("E ")]


GROUP_MEMBER = re.compile(r"^\s*\+[-+]* (?:\d+|\.\.\.) -+\s*$", re.MULTILINE)
MEMBER_ERROR = re.compile(
    r"^[\s|]*([\w.]+(?:Error|Warning|Exception|Exit)(?:: .*)?)$", re.MULTILINE
)
IGNORED_IN = re.compile(
    r"Exception ignored in: <(?:function )?(.{1,80}?)(?: at 0x\w+>|>?$)", re.MULTILINE
)


def group_members(traceback: str, most: int = 6) -> list[str]:
    """The first line of each of an exception group's members, as pytest prints the group (its
    unraisable-exception warnings are one: the object whose `__del__` raised is named too), so
    a CI log cut to its tail says what each was; the same line once, with how often."""
    members = GROUP_MEMBER.split(traceback)[1:]
    lines: list[str] = []
    for member in members:
        errors = MEMBER_ERROR.findall(member)
        if not errors:
            continue
        ignored_in = IGNORED_IN.search(member)
        lines.append(errors[0][:240] + (f" (in {ignored_in.group(1)})" if ignored_in else ""))
    counted = {line: lines.count(line) for line in lines}
    return [line if n == 1 else f"{line} (x{n})" for line, n in counted.items()][:most]


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
    beside_each_other(NO_RAY, (STOPPING_RAY, BUILDING), outcomes, reports)
    beside_each_other(("main",), (BESIDE_MAIN,), outcomes, reports)
    beside_each_other(LAST, (BESIDE_LAST, RUNNING_IMAGE), outcomes, reports)


def beside_each_other(
    first: tuple[str, ...],
    lanes: tuple[tuple[str, ...], ...],
    outcomes: list[Outcome],
    reports: Path,
) -> None:
    """`first` here (its output ours) and each lane in a thread (its output printed after)."""
    besides: list[list[Outcome]] = [[] for _ in lanes]
    with tempfile.TemporaryDirectory(prefix="gps-suites-") as folder:
        logs = [Path(folder) / f"lane-{n}.log" for n in range(len(lanes))]
        with contextlib.ExitStack() as sinks:
            threads = [
                threading.Thread(
                    target=run_in_order,
                    args=(lane, beside, reports, sinks.enter_context(log.open("w"))),
                    daemon=True,
                )
                for lane, beside, log in zip(lanes, besides, logs, strict=True)
            ]
            for thread in threads:
                thread.start()
            try:
                run_in_order(first, outcomes, reports)
                for thread in threads:
                    thread.join()
            finally:
                for lane, beside, log in zip(lanes, besides, logs, strict=True):
                    outcomes.extend(beside)
                    print(f"\n===== run beside {', '.join(first)}: {', '.join(lane)} =====")
                    print(log.read_text(errors="replace"), flush=True)


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown suites: {', '.join(unknown)}; known: {', '.join(SUITES)}")
        return 2
    outcomes: list[Outcome] = []
    os.environ.setdefault(RUN_VARIABLE, uuid.uuid4().hex[:12])  # inherited by every session
    started, busy_before = time.monotonic(), machine_busy_s()
    with tempfile.TemporaryDirectory(prefix="gps-reports-") as folder, CPU:
        try:
            if names:
                run_in_order(names, outcomes, Path(folder))
            else:
                run_all(outcomes, Path(folder))
        finally:
            busy_s = machine_busy_s() - busy_before
            _report(outcomes, time.monotonic() - started, busy_s, side_by_side=not names)
    return next((o.status for o in outcomes if o.status != 0), 0)


def _report(outcomes: list[Outcome], wall_s: float, busy_s: float, side_by_side: bool) -> None:
    beside = (
        f" ({', '.join(STOPPING_RAY)} and {', '.join(BUILDING)} ran beside "
        f"{', '.join(NO_RAY)}; {', '.join(BESIDE_MAIN)} beside main; then "
        f"{', '.join(BESIDE_LAST)} and {', '.join(RUNNING_IMAGE)} beside {', '.join(LAST)})"
        if side_by_side
        else ""
    )
    print(f"\nsuite times{beside}, and the CPU of each one's processes:")
    for o in outcomes:
        outcome = "ok" if o.status == 0 else f"FAILED ({o.status})"
        print(f"  {o.name:<11} {o.seconds / 60:6.1f} min  cpu {o.cpu_s / 60:5.1f} min  {outcome}")
    print(
        f"  {'wall':<11} {wall_s / 60:6.1f} min  cpu {sum(o.cpu_s for o in outcomes) / 60:5.1f} min"
    )
    cores = os.cpu_count() or 1
    print(
        f"  the machine was busy {busy_s / 60:.1f} core-min of {cores * wall_s / 60:.1f} "
        f"({cores} cores); what no suite's processes account for ran outside their sessions "
        "or for less than one reading"
    )
    for o in sorted(outcomes, key=lambda o: -o.cpu_s)[:HEAVIEST]:
        kinds = ", ".join(f"{title} {s / 60:.1f}" for title, s in o.cpu_by_kind[:KINDS_SHOWN])
        if kinds:
            print(f"  {o.name}'s CPU (min) went to {kinds}")
    for o in outcomes:
        for failure in o.failures:
            print(f"FAILED in {o.name}: {failure}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, pass_on)
    signal.signal(signal.SIGTERM, pass_on)
    sys.exit(main(sys.argv[1:]))
