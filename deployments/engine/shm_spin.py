"""How long vLLM's engine processes spin for their next message before they sleep.

vLLM's EngineCore and its worker hand each step to each other over shared memory (vLLM's
`shm_broadcast.MessageQueue`). A reader spins on `sched_yield` for `busy_loop_s` after each
message it read, then parks on a zmq notification, and vLLM 0.32 fixes that window at 1 s. So
EngineCore spins through its worker's whole forward pass, and the worker spins for a second
after every answer. On a GPU node a spare host core buys latency. On a CPU engine that core is
the one the engine and the replicas beside it compute on: an engine of the demo model used
2.4 s of CPU per answer of 16 tokens with vLLM's 1 s and 0.8 s with 2 ms, answers 2 s apart,
and decoded back to back at 0.96 x the speed (`python -m bench.engine_spin`).

The window comes from `GPS_ENGINE_SHM_SPIN_S` in the replica's environment: cluster/backends.py
sets it for CPU engines, a model's env_vars may set it for any. Not upstream's proposed
`VLLM_SHM_BROADCAST_BUSY_LOOP_S` (vllm-project/vllm#52814, open): vLLM 0.32 warns of every
`VLLM_*` variable it does not know, and refuses to start on one under
`fail_on_environ_validation`. When the pinned vLLM reads a window itself, this module goes.

The `.pth` hook that arms the parent-death signal (parent_death.py) calls `apply_from_env` in
every process the replica spawns with multiprocessing: on a CPU engine EngineCore and its
worker, both readers. On a GPU engine Ray Serve LLM runs the workers as Ray actors, which the
hook does not reach: there it sets EngineCore's reads only. It changes the default of
`SpinCondition.__init__`'s `busy_loop_s` when vLLM's module is imported (wrapt's post-import
hook), so nothing of vLLM is imported here.

Only the standard library at import: this runs at the start of every engine process.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from types import ModuleType

ENV = "GPS_ENGINE_SHM_SPIN_S"
# CPU engines: a read within 2 ms of the last keeps the fast path, a longer gap sleeps on the
# notification (the default a vLLM fork chose for the same reason, local-inference-lab/vllm#421,
# and builds patched for integrated GPUs).
CPU_ENGINE_S = "0.002"
MODULE = "vllm.distributed.device_communicators.shm_broadcast"


def window_s(value: str) -> float:
    """The window in seconds: a finite number, 0 or more (ValueError otherwise)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{ENV} must be a finite number of seconds, 0 or more: {value!r}")
    return seconds


def apply_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """Set vLLM's window from the environment once its module is imported; returns the window
    set, or None where the variable is absent or not a window (vLLM's 1 s stays)."""
    value = environ.get(ENV)
    if value is None:
        return None
    try:
        seconds = window_s(value)
    except ValueError as error:
        print(f"{error}; vLLM's own window stays", file=sys.stderr)
        return None
    import wrapt  # only here: most processes never set the variable

    wrapt.register_post_import_hook(lambda module: _set_or_say(module, seconds), MODULE)
    return seconds


def _set_or_say(module: ModuleType, seconds: float) -> None:
    # A post-import hook runs inside vLLM's import: whatever it raises would fail the import
    # and the engine's start, for a window that only saves CPU.
    try:
        set_window(module, seconds)
    except Exception as error:  # noqa: BLE001
        print(f"{ENV}: not set ({error!r}); vLLM's own window stays", file=sys.stderr)


def set_window(module: ModuleType, seconds: float) -> bool:
    """Make `seconds` the default `busy_loop_s` of the module's SpinCondition; False, and vLLM
    left as it is, where that parameter is not there (another vLLM)."""
    import inspect  # here, not at every engine process's start

    init = getattr(getattr(module, "SpinCondition", None), "__init__", None)
    defaults = getattr(init, "__defaults__", None)
    if init is None or defaults is None:
        return _unchanged(module)
    with_defaults = [
        p.name
        for p in inspect.signature(init).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty
    ]
    if "busy_loop_s" not in with_defaults or len(with_defaults) != len(defaults):
        return _unchanged(module)
    values = list(defaults)
    values[with_defaults.index("busy_loop_s")] = seconds
    init.__defaults__ = tuple(values)
    return True


def _unchanged(module: ModuleType) -> bool:
    print(f"{ENV}: {module.__name__} has no SpinCondition(busy_loop_s=...)", file=sys.stderr)
    return False
