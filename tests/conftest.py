"""One real Ray Serve app for the whole test session: real HTTP, real vLLM CPU engines (and two
models on the test engine, whose subject is the router: tests/e2e/test_catalog.py).

Shared by tests/e2e (behaviour) and tests/chaos (faults and bad input under load); started only
by the first test that asks for it, so unit-only runs never start Ray. Chaos runs last: it kills
replicas, and the behaviour tests should see an app that has not been through that.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
import ray.cloudpickle
from hypothesis import settings
from ray import serve
from ray.serve.handle import DeploymentHandle

from bench.lora_adapter import make_adapter
from cluster.app import build_gateway
from cluster.backends import build_backend, build_fallback
from cluster.driver_handles import deployment_handle
from cluster.ray_runtime import local_pool_resources
from cluster.vision_model import VISION_NAME
from core.config import ClusterConfig, load_config
from core.types import FALLBACK_BACKEND
from tests.local_ray import start_retrying, stop_serve_and_ray, use_loaded_machine_settings

# Every session's tests live under this folder, so every Ray cluster a test starts gets them.
use_loaded_machine_settings()

ROOT = Path(__file__).parents[1]
# No time limit on a property test's example: make test runs suites side by side, and one
# example of test_admission took 455 ms beside them against Hypothesis's 200 ms default. What
# the tests say must not hang on how busy the machine is (no timed assertions).
settings.register_profile("gps", deadline=None)
settings.load_profile("gps")
E2E = Path(__file__).with_name("e2e")
CONFIG = E2E / "gateway.yaml"
API_KEY = "test-user-key"  # its sha256 is in gateway.yaml
PORT = int(os.environ.get("GPS_E2E_PORT", "18000"))
PROBED_BACKEND = "coding@local"
PROBE_DEPLOYMENT = f"probe:{PROBED_BACKEND}"
# The default model of role reasoning (a test engine) is probed too: test_catalog.py fails it.
THINKER_BACKEND = "thinker@local"
THINKER_PROBE_DEPLOYMENT = f"probe:{THINKER_BACKEND}"
# gateway.yaml's adapter of vision (of the demo vision model's language model): its
# adapter_config.json is checked in (the config's load checks it), its weights are made by this
# session (the same on every machine: seeded).
ADAPTER = E2E / "adapters" / "vision-sql"
# The vision backend has a KV cache smaller than two requests and an out-of-memory switch.
SWITCHED_BACKEND = "vision@local"


def _load_test_module(file: str) -> Any:
    """A helper module of tests/e2e, imported by path (pytest runs in importlib mode, tests
    are not a package), whose code Serve replicas get by value: they cannot import this folder."""
    spec = importlib.util.spec_from_file_location(f"gps_e2e_{Path(file).stem}", E2E / file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.path)).parts
        if "e2e" in parts or "chaos" in parts:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: "chaos" in Path(str(item.path)).parts)  # stable: chaos last


probe_module = _load_test_module("probe.py")
oom_switch_module = _load_test_module("oom_switch.py")


@pytest.fixture(scope="session")
def config(tmp_path_factory: pytest.TempPathFactory) -> ClusterConfig:
    config = load_config(CONFIG, environ={})
    # Batches of this session alone: none left by an earlier run is taken up again.
    batches = config.batches.model_copy(update={"directory": tmp_path_factory.mktemp("batches")})
    # Stored responses of this session alone, in a file of its own.
    stored = tmp_path_factory.mktemp("responses") / "responses.sqlite3"
    gateway = config.gateway.model_copy(update={"responses_db": stored})
    config = config.model_copy(update={"batches": batches, "gateway": gateway})
    for model in config.models:
        source = Path(config.resolve_path(model.source))
        if not source.is_dir():
            pytest.fail(f"{source} is missing: run `make model` (make test does it)")
    make_adapter(ROOT / ".models" / VISION_NAME, ADAPTER, seed=7, base_name=VISION_NAME)
    return config


@pytest.fixture(scope="session")
def gateway(config: ClusterConfig) -> Iterator[str]:
    # "local": a fresh cluster of our own, whatever address a dead one left in /tmp/ray.
    start_retrying(
        lambda: ray.init(address="local", namespace="serve", resources=local_pool_resources(config))
    )
    # The proxy must be up before the engines load: on 2 cores it otherwise misses its
    # readiness checks and dies (docs/design.md, environment facts).
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    backends = {
        b.name: build_backend(config, b) for b in config.home_backends if b.name != SWITCHED_BACKEND
    }
    [switched] = [b for b in config.home_backends if b.name == SWITCHED_BACKEND]
    backends[SWITCHED_BACKEND] = build_backend(
        config, switched, oom_switch_module.OomSwitchLLMServer
    )
    # One build token for the gateway and the fallback: a reload (tests/e2e) awaits both.
    build = uuid.uuid4().hex
    backends[FALLBACK_BACKEND] = build_fallback(config, build)
    # Coding and thinker are reached through probes that count and can fail on demand.
    for backend in (PROBED_BACKEND, THINKER_BACKEND):
        probe = serve.deployment(probe_module.Probe).options(
            name=f"probe:{backend}", max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0}
        )
        backends[backend] = probe.bind(backends[backend])
    serve.run(build_gateway(config, backends, build), name="gateway", route_prefix="/")
    yield f"http://127.0.0.1:{PORT}"
    stop_serve_and_ray()


@pytest.fixture(scope="session")
def probe(gateway: str) -> DeploymentHandle:
    """The probe in front of coding@local (see probe.py)."""
    return deployment_handle(PROBE_DEPLOYMENT, "gateway")


@pytest.fixture(scope="session")
def thinker_probe(gateway: str) -> DeploymentHandle:
    """The probe in front of thinker@local (see probe.py)."""
    return deployment_handle(THINKER_PROBE_DEPLOYMENT, "gateway")


@pytest.fixture(scope="session")
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def http(gateway: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=gateway, headers=headers, timeout=120) as session:
        yield session


@pytest.fixture(scope="module")
def bare_llm_url(gateway: str) -> Iterator[str]:
    """Bare ray.serve.llm (its own OpenAiIngress) over the gateway's orchestrator replicas,
    deleted after the module that asks for it: its replica holds most of a GiB, and suites run
    beside this session (tests/suites.py)."""
    from ray.llm._internal.serve.core.configs.openai_api_models import ModelCard
    from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, make_fastapi_ingress

    replicas = serve.get_deployment_handle("model:orchestrator@local", app_name="gateway")
    card = ModelCard(id="orchestrator", object="model", owned_by="bare", permission=[], metadata={})
    # No CPU reserved: the engines and the fallback have booked both of this machine's cores.
    bare = serve.deployment(
        make_fastapi_ingress(OpenAiIngress),
        name="bare-ingress",
        ray_actor_options={"num_cpus": 0},
    ).bind(llm_deployments={"orchestrator": replicas}, model_cards={"orchestrator": card})
    serve.run(bare, name="bare", route_prefix="/bare")
    yield f"{gateway}/bare/v1/chat/completions"
    serve.delete("bare")
