"""`gateway.log_encoding`: every deployment of the app logs in the one encoding. Built without
Ray: the model deployments by their LLMConfig (Ray Serve LLM's builder starts Ray to size them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.serve.deployment import Application, Deployment

from cluster.app import build_gateway
from cluster.backends import build_fallback, llm_config_for
from core.config import ClusterConfig, load_config

E2E_CONFIG = Path(__file__).parents[1] / "e2e" / "gateway.yaml"


def with_encoding(encoding: str, router_in_ingress: bool = True) -> ClusterConfig:
    config = load_config(E2E_CONFIG, environ={})
    gateway = config.gateway.model_copy(
        update={"log_encoding": encoding, "router_in_ingress": router_in_ingress}
    )
    return config.model_copy(update={"gateway": gateway})


def deployments(app: Application) -> dict[str, Deployment]:
    """Every deployment bound in the app, by name. Serve keeps an Application's deployment on
    `_bound_deployment` and its bound arguments in its replica config (no public accessor)."""
    found: dict[str, Deployment] = {}

    def walk(value: Any) -> None:
        if isinstance(value, Application):
            deployment = value._bound_deployment
            found[deployment.name] = deployment
            bound = deployment._replica_config
            for argument in (*bound.init_args, *bound.init_kwargs.values()):
                walk(argument)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(app)
    return found


def encodings(config: ClusterConfig) -> dict[str, str]:
    """Each deployment's encoding: the gateway's and the fallback's as bound, the models' from
    the LLMConfig their deployments are built from."""
    gateway = build_gateway(config, {"cpu-fallback": build_fallback(config)})
    found = {name: d.logging_config["encoding"] for name, d in deployments(gateway).items()}
    for backend in config.backends:
        options = llm_config_for(config, backend).deployment_config
        found[backend.name] = options["logging_config"]["encoding"]
    return found


def test_json_reaches_every_deployment_and_the_router_keeps_its_access_log_off() -> None:
    for router_in_ingress in (True, False):
        config = with_encoding("JSON", router_in_ingress)
        found = encodings(config)
        assert {"ingress", "model:cpu-fallback", "orchestrator@local"} <= set(found)
        assert ("router" in found) is not router_in_ingress
        assert set(found.values()) == {"JSON"}, found
    gateway = build_gateway(with_encoding("JSON", False), {})
    assert deployments(gateway)["router"].logging_config["enable_access_log"] is False


def test_text_is_the_default() -> None:
    config = load_config(E2E_CONFIG, environ={})
    assert config.gateway.log_encoding == "TEXT"
    assert set(encodings(config).values()) == {"TEXT"}
