"""The gateway's processes without the libraries Ray Serve loads for others.

Ray Serve imports pandas wherever it is installed (to encode a DataFrame a replica returns as
JSON), and pandas imports pyarrow: about 67 MiB resident in every process that imports Serve.
vLLM's install brings both to every node; the gateway's replicas return no DataFrames and no
module of ours imports either. So the ingress, router and fallback replicas (and the detached
actors they start, which inherit their runtime env) start with both marked absent, before the
worker loads its actor's class: `import pandas` then fails there as where it is not installed,
and Serve takes the path it takes then. tests/unit/test_light_gateway.py and
tests/chaos/test_what_the_gateway_loaded.py hold it so. And a replica that has loaded its
tokenizers hands the heap pages that left free back (`release_freed_memory`).
"""

from __future__ import annotations

import ctypes
import os
import sys

from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

__all__ = ["UNUSED", "forgo_unused", "light_process_env", "release_freed_memory"]

UNUSED = ("pandas", "pyarrow")


def light_process_env() -> dict[str, str]:
    """A runtime env's variables that run `forgo_unused` in the worker before its actor's
    class loads. Ray reads `worker_process_setup_hook` from a job's runtime env only, and
    passes it to the worker as this variable: set here per actor instead."""
    return {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: f"{__name__}.{forgo_unused.__name__}"}


def forgo_unused() -> None:
    """Mark the `UNUSED` libraries absent in this process (a `None` in `sys.modules` makes
    `import` raise ImportError), unless one is loaded already; and not in the processes it
    starts, whose workers may serve an engine that needs them (the cluster manager's `ray start`
    of a new node): the variable leaves this process's environment. The actors it starts still
    inherit it, through the runtime env Ray hands them."""
    os.environ.pop(WORKER_PROCESS_SETUP_HOOK_ENV_VAR, None)
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`): loading a
    tokenizer parses its JSON in many small allocations that are freed at once but kept by the
    allocator, about 25 MiB a replica. False where the C library has no such call."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    trim(0)
    return True
