"""`make test`'s suites, one pytest session each, in order, with each one's time at the end.

The main session holds the shared e2e app (unit, integration, e2e, chaos); the others start
clusters of their own (three-node, `ray up`, whole apps started and stopped), so they cannot
share its process. The table is printed however the run ends; the exit status is the first
failing suite's, and no suite runs after it.

    python tests/suites.py [NAME ...]    # all, in order, when no name is given
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [str(ROOT / ".venv" / "bin" / "pytest"), "-q"]
OWN_CLUSTERS = ("placement", "autoscale", "monitoring", "batch", "recovery", "rayup", "stop")
SUITES: dict[str, list[str]] = {
    "main": [
        "tests",
        "--durations=40",
        *(f"--ignore=tests/{name}" for name in OWN_CLUSTERS),
    ],
    **{name: [f"tests/{name}", "-s", "--durations=10"] for name in OWN_CLUSTERS},
}


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown suites: {', '.join(unknown)}; known: {', '.join(SUITES)}")
        return 2
    times: list[tuple[str, float, int]] = []
    status = 0
    try:
        for name in names or list(SUITES):
            started = time.monotonic()
            status = subprocess.run([*PYTEST, *SUITES[name]], cwd=ROOT, check=False).returncode
            times.append((name, time.monotonic() - started, status))
            if status != 0:
                break
    finally:
        _report(times)
    return status


def _report(times: list[tuple[str, float, int]]) -> None:
    print("\nsuite times:")
    for name, seconds, status in times:
        outcome = "ok" if status == 0 else f"FAILED ({status})"
        print(f"  {name:<11} {seconds / 60:6.1f} min  {outcome}")
    print(f"  {'total':<11} {sum(s for _, s, _ in times) / 60:6.1f} min")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
