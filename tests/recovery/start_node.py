"""The `command` provisioner of tests/recovery: starts a real Ray node on this machine that
joins GPS_RAY_ADDRESS with the pool's resource, and returns once `ray start` is under way.

The node runs under a keeper (this file with --keep), in a session of its own, so the test can
kill the whole node (keeper, `ray start --block`, its raylet and the workers under it) by that
process tree; the keeper's pid goes to GPS_TEST_NODE_PIDS. Like a cloud instance's boot script
under a service manager that restarts it on failure, the keeper starts `ray start --block` again
when it ends within STARTING_S: a raylet waits a fixed 15 s (not configurable) for its
dashboard agent to write its ports, and on a loaded machine the agent missed it and the raylet
crashed before it registered (a run here on an AVX2-only machine, 2026-11-28). A node that ran
longer is not restarted: its death is the test's to see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

KEEP = "--keep"
STARTS = 4
STARTING_S = 200.0  # longer than a start's own waits (15 s for the agent, 150 s to register)


def main() -> None:
    log = Path(os.environ["GPS_TEST_NODE_PIDS"]).with_suffix(".log")
    with log.open("ab") as out:
        keeper = subprocess.Popen(
            [sys.executable, __file__, KEEP],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with Path(os.environ["GPS_TEST_NODE_PIDS"]).open("a") as pids:
        pids.write(f"{keeper.pid}\n")
    print(f"started a Ray node for {os.environ['GPS_POOL']} (keeper pid {keeper.pid})")


def keep() -> None:
    """`ray start --block` again while it ends within STARTING_S, up to STARTS times."""
    resources = json.dumps({os.environ["GPS_POOL_RESOURCE"]: 1})
    # `ray start`, waiting for the node's registration longer than Ray's 30 s (cluster/ray_start.py)
    command = [
        sys.executable,
        "-m",
        "cluster.ray_start",
        "start",
        f"--address={os.environ['GPS_RAY_ADDRESS']}",
        f"--resources={resources}",
        "--num-cpus=1",
        "--block",
    ]
    for start in range(1, STARTS + 1):
        began = time.monotonic()
        status = subprocess.call(command)
        lived_s = time.monotonic() - began
        if lived_s >= STARTING_S or start == STARTS:
            return
        print(f"keeper: `ray start` {start} ended with {status} after {lived_s:.0f} s: again")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:] == [KEEP]:
        keep()
    else:
        main()
