"""The `command` provisioner of tests/recovery: starts a real Ray node on this machine that
joins GPS_RAY_ADDRESS with the pool's resource, and returns once `ray start` is under way.

`ray start --block` runs in a session of its own, so the test can kill the whole node (its
raylet and the workers under it) by that process group; its pid goes to GPS_TEST_NODE_PIDS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def main() -> None:
    resources = json.dumps({os.environ["GPS_POOL_RESOURCE"]: 1})
    ray = Path(sys.executable).with_name("ray")
    log = Path(os.environ["GPS_TEST_NODE_PIDS"]).with_suffix(".log")
    with log.open("ab") as out:
        node = subprocess.Popen(
            [
                str(ray),
                "start",
                f"--address={os.environ['GPS_RAY_ADDRESS']}",
                f"--resources={resources}",
                "--num-cpus=1",
                "--block",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with Path(os.environ["GPS_TEST_NODE_PIDS"]).open("a") as pids:
        pids.write(f"{node.pid}\n")
    print(f"started a Ray node for {os.environ['GPS_POOL']} (pid {node.pid})")


if __name__ == "__main__":
    main()
