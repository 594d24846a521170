"""What a gateway process pays to load its code before it can serve: the import of each gateway
replica's module (ingress, router, fallback) in a fresh interpreter, as Ray starts it (the
light-process hook first), in wall seconds and resident MiB, against the anchor measured in the
same run: a fresh interpreter importing Ray Serve alone, which any Serve replica pays.

    python -m bench.gateway_start                  # this tree, 5 rounds
    python -m bench.gateway_start --tree DIR       # another checkout (a `git worktree`), same venv

Issue 54 asks for an ingress replica's start before and after the engine left the gateway:
run it here and on a worktree of 024f299^ (the last commit whose gateway imported vLLM). The
replica's whole start (worker, import, constructor, first health check) is what Serve's
controller logs as "started successfully ... after N s"; the import is the part this code
decides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = "ray.serve"
MODULES = (
    ("ingress", "deployments.ingress.app"),
    ("router", "deployments.router.router"),
    ("fallback", "deployments.fallback.replica"),
)

PROBE = """
import importlib, json, os, resource, sys, time
started = time.perf_counter()
try:
    from deployments.light_process import forgo_unused  # the tree's hook, where it has one
    forgo_unused()
except ImportError:
    pass
importlib.import_module(sys.argv[1])
seconds = time.perf_counter() - started
kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "mib": kib / 1024,
                  "engine": sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "torch"})}))
"""


@dataclass(frozen=True)
class Start:
    seconds: float
    mib: float
    engine: tuple[str, ...]


def start(module: str, tree: Path) -> Start:
    """One fresh interpreter's import of `module` from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    reading = json.loads(done.stdout.strip().splitlines()[-1])
    return Start(float(reading["seconds"]), float(reading["mib"]), tuple(reading["engine"]))


def median_start(module: str, tree: Path, rounds: int) -> Start:
    starts = [start(module, tree) for _ in range(rounds)]
    return Start(
        statistics.median(s.seconds for s in starts),
        statistics.median(s.mib for s in starts),
        starts[-1].engine,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_start")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to import from")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tree = args.tree.resolve()
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    # The first round warms the page cache; the median is what a start on a warm node pays.
    anchor = median_start(ANCHOR, tree, args.rounds)
    print(f"tree {tree} ({commit or 'no git'}), median of {args.rounds} fresh interpreters")
    print(f"{'process':<10} {'import s':>9} {'x anchor':>9} {'MiB':>7} {'x anchor':>9}  engine")
    print(f"{'anchor':<10} {anchor.seconds:>9.2f} {1:>9.2f} {anchor.mib:>7.0f} {1:>9.2f}  "
          f"{','.join(anchor.engine) or '-'}  ({ANCHOR} alone)")  # fmt: skip
    for name, module in MODULES:
        measured = median_start(module, tree, args.rounds)
        print(
            f"{name:<10} {measured.seconds:>9.2f} {measured.seconds / anchor.seconds:>9.2f} "
            f"{measured.mib:>7.0f} {measured.mib / anchor.mib:>9.2f}  "
            f"{','.join(measured.engine) or '-'}"
        )


if __name__ == "__main__":
    main()
