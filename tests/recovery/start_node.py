"""The `command` provisioner of tests/recovery: starts a real Ray node on this machine that
joins GPS_RAY_ADDRESS with the pool's resource, and returns once `ray start` is under way.

`ray start --block` runs in a session of its own, so the test can kill the whole node (its
raylet and the workers under it) by that process group; its pid goes to GPS_TEST_NODE_PIDS.
It runs in this script's own Python with tests/local_ray.py's patience for the raylet's
registration: at load average 45-70 on 2 cores, all three attempts of a plain `ray start` missed
Ray's fixed 30 s (run of 2d90e16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RAY_START = "ray-start"  # this script, run as the node's process: a patient `ray start`


def main() -> None:
    resources = json.dumps({os.environ["GPS_POOL_RESOURCE"]: 1})
    log = Path(os.environ["GPS_TEST_NODE_PIDS"]).with_suffix(".log")
    with log.open("ab") as out:
        node = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                RAY_START,
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


def patient_ray_start(arguments: list[str]) -> None:
    """`ray start ARGUMENTS`, with the registration patience of the test clusters' own starts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
    from ray.scripts.scripts import main as ray_cli

    from tests.local_ray import _patient_registration

    sys.argv = ["ray", "start", *arguments]
    with _patient_registration():
        ray_cli()


if __name__ == "__main__":
    if sys.argv[1:2] == [RAY_START]:
        patient_ray_start(sys.argv[2:])
    else:
        main()
