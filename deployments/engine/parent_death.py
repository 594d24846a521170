"""Engine processes die with the replica that started them, however the replica ends.

vLLM runs its engine in processes of its own (replica -> `VLLM::EngineCore` -> `VLLM::Worker`,
both started with multiprocessing's spawn). Nothing in vLLM 0.32 or Ray 2.60 kills an
EngineCore whose replica was killed with SIGKILL (`ray stop --force`, a replica killed while its
engine starts, a node's OOM killer): Ray kills a worker's direct children only when the worker
exits by itself, and its subreaper and process-group cleanups need a live raylet, which
`ray stop --force` kills first. The orphan keeps its memory (on a GPU, the VRAM the next replica
needs) until someone finds it.

The kernel's parent-death signal does it with no code in the dying parent: a process that set
PR_SET_PDEATHSIG gets SIGKILL when its parent exits. vLLM does not set it, so a one-line `.pth`
file in the environment's site-packages (`python -m deployments.engine.parent_death install`; `make
install` runs it) arms it at interpreter start in every multiprocessing child of a process
whose environment carries `GPS_ENGINE_PDEATHSIG=1`: our LLM deployments set it for their
replicas, and spawned children inherit it. The Ray worker itself is not a multiprocessing child
and is left alone.

SIGKILL, not SIGTERM: EngineCore defers SIGTERM while it loads the model. Linux sends the signal
when the *thread* that started the child exits: Serve constructs LLMServer (and vLLM spawns
EngineCore) on the replica's user-code event-loop thread, which lives as long as the replica;
EngineCore spawns its workers from its main thread.

The hook also sets how long those processes spin for their next step (shm_spin.py): it runs in
exactly them, and before vLLM's modules are imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import site
import sys
from pathlib import Path

ENV = "GPS_ENGINE_PDEATHSIG"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PTH_NAME = "gps_engine_parent_death.pth"
# .pth lines that start with `import` are executed at every interpreter start: keep it cheap.
PTH_LINE = (
    "import os; os.environ.get('GPS_ENGINE_PDEATHSIG') == '1' and "
    "__import__('deployments.engine.parent_death').engine.parent_death.arm_if_spawned()\n"
)


def die_with_parent(expected_parent: int, sent: int = signal.SIGKILL) -> None:
    """`sent` (SIGKILL) to this process when its parent exits; exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sent), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # Checked after arming: the parent may have died in between.
    if os.getppid() != expected_parent:
        raise SystemExit(f"parent {expected_parent} is gone")


def arm_if_spawned() -> None:
    """The `.pth` hook: arm the signal in multiprocessing's spawned children only."""
    if "--multiprocessing-fork" not in getattr(sys, "orig_argv", ()):
        return
    parent = os.getppid()
    if parent == 1:  # already orphaned before we got here
        os._exit(1)
    die_with_parent(parent)
    # The same children are vLLM's readers of its step queues: their spin window (shm_spin.py).
    from deployments.engine import shm_spin

    shm_spin.apply_from_env()


def installed(paths: list[str] | None = None) -> bool:
    return any((Path(p) / PTH_NAME).is_file() for p in paths or site.getsitepackages())


def install() -> Path:
    """Write the hook into this environment's site-packages (every node's venv needs it)."""
    target = Path(site.getsitepackages()[0]) / PTH_NAME
    target.write_text(PTH_LINE)
    return target


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(f"installed {install()}")
    elif sys.argv[1:] == ["check"]:
        raise SystemExit(0 if installed() else f"{PTH_NAME} is not installed")
    else:
        raise SystemExit("usage: python -m deployments.engine.parent_death install|check")
