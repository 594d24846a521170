"""No engine code in the gateway's processes (issue 54): each module a gateway process runs
(ingress, router, fallback, slot broker, key ledger and registry, response keeper, batch actor,
placer, cluster manager) imports without loading vLLM or torch, checked in a fresh interpreter
as the process starts; and bench/layering.py's rule finds no module of theirs that imports
them. Started as Ray starts them (deployments/light_process.py's hook first), they load no pandas
or pyarrow either. (tests/chaos/test_what_the_gateway_loaded.py reads the running replicas' own
loaded modules.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.layering import loads_the_engine
from deployments.light_process import UNUSED, light_process_env

ROOT = Path(__file__).resolve().parents[2]

GATEWAY_MODULES = (
    "deployments.ingress.app",
    "deployments.router.router",
    "deployments.router.adapters.serve_ports",
    "deployments.router.slot_broker",
    "deployments.fallback.replica",
    "deployments.keys.ledger",
    "deployments.keys.registry",
    "deployments.ingress.responses.keeper",
    "deployments.batch.actor",
    "autoscale.placer",
    "autoscale.cluster_manager",
)
ENGINE = ("vllm", "torch")

PROBE = """
import importlib, json, os, sys
from ray._common.utils import load_class
if {hooked!r}:  # as Ray's worker does before it loads its actor's class
    load_class(os.environ[{hook!r}])()
for name in sys.argv[1:]:
    importlib.import_module(name)
loaded = [m for m, module in sys.modules.items() if module is not None]  # None: marked absent
print(json.dumps(sorted(m for m in loaded if m.split(".")[0] in {libraries!r})))
"""


def loaded_libraries(
    *modules: str, libraries: tuple[str, ...] = ENGINE, hooked: bool = False
) -> list[str]:
    """The `libraries`' top modules a fresh interpreter has loaded after importing `modules`
    (`hooked`: with the gateway's worker setup hook run first, from its runtime env)."""
    ((hook, target),) = light_process_env().items()
    probe = PROBE.format(libraries=set(libraries), hooked=hooked, hook=hook)
    done = subprocess.run(
        [sys.executable, "-c", probe, *modules],
        env={**os.environ, hook: target},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return sorted({name.split(".")[0] for name in loaded})


def test_no_gateway_module_loads_vllm_or_torch() -> None:
    loaded = loaded_libraries(*GATEWAY_MODULES)
    if loaded:  # name the module that brings them, one interpreter each
        guilty = {m: loaded_libraries(m) for m in GATEWAY_MODULES}
        pytest.fail(f"loaded {loaded}: { ({m: e for m, e in guilty.items() if e}) }")


def test_the_probe_sees_the_engine_where_it_is_loaded() -> None:
    assert loaded_libraries("deployments.engine.requests") == ["torch", "vllm"]


def test_started_as_ray_starts_them_the_gateway_modules_load_no_pandas_or_pyarrow() -> None:
    # Serve imports pandas where it can: without the hook, these imports load both.
    assert loaded_libraries(*GATEWAY_MODULES, libraries=UNUSED) == sorted(UNUSED)
    assert loaded_libraries(*GATEWAY_MODULES, libraries=UNUSED, hooked=True) == []


@pytest.mark.parametrize(
    ("module", "target", "against"),
    [
        ("deployments.router.request_path.flow", "vllm.entrypoints.openai", True),
        ("deployments.ingress.app", "ray.serve.llm", True),
        ("policy.oom", "torch", True),
        ("deployments.fallback.openai_format", "ray.llm._internal.serve.core.configs.x", True),
        ("deployments.engine.llm_server", "ray.serve.llm", False),
        (
            "deployments.router.adapters.replica_choice",
            "ray.llm._internal.serve.routing_policies",
            False,
        ),
        ("cluster.backends", "vllm", False),  # the composition root builds the engine's app
    ],
)
def test_the_layering_rule(module: str, target: str, against: bool) -> None:
    assert loads_the_engine(module, target) is against


CHILD = """
import os, subprocess, sys
from ray._common.utils import load_class
load_class(os.environ[{hook!r}])()
try:
    import pyarrow
    print("parent loaded pyarrow")
except ImportError:
    print("parent without pyarrow")
# A worker of a node the process starts: it runs the hook where the variable reaches it.
child = "; ".join([
    "import os",
    "from ray._common.utils import load_class",
    "os.environ.get({hook!r}) and load_class(os.environ[{hook!r}])()",
    "import pyarrow.fs",
    "print('child loaded pyarrow')",
])
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout)
"""


def test_what_the_hooked_process_starts_keeps_the_libraries() -> None:
    # The cluster manager's `ray start` of a new node: that node's engines need pyarrow.
    ((hook, target),) = light_process_env().items()
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(hook=hook)],
        cwd=ROOT,
        env={**os.environ, hook: target},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == "parent without pyarrow child loaded pyarrow".split()
