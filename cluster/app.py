"""The Serve application: `serve run cluster.app:build [config=PATH]`.

Ingress (HTTP, auth, schema) -> Router (admission, failover) -> one LLMServer deployment per
`model@pool` backend, and the CPU fallback replica that ends every chain. With no `config`, the
embedded local default (ray_configs/local.yaml).

Beside the deployments, the app has detached Ray actors, one of each per app (by name, in the
Serve namespace), that no deployment owns: the first replica to need one starts it
(`get_if_exists`), Ray restarts it when it dies, and it outlives the app (`ray stop` ends
it). Who starts each, and what it keeps:

- SlotBroker (deployments/router/slot_broker.py): each router replica starts it
  (`ensure_slot_broker`); the slots the routers share, in memory.
- KeyLedger (deployments/keys/ledger.py): the ingress, on a keyed request
  (`replica_key_ledger`); each key's usage, snapshotted to the GCS.
- KeyRegistry (deployments/keys/registry.py): the ingress (`replica_registry`, below); the
  run-time keys, in `gateway.keys_db`.
- ResponseKeeper (deployments/ingress/responses/keeper.py): the ingress
  (`replica_response_keeper`); stored responses, in `gateway.responses_db`.
- BatchActor (deployments/batch/actor.py): the ingress (`replica_batch_actor`); files and
  batches, in `batches.directory`.
- Placer (autoscale/placer.py): each router replica (`ensure_placer`); placements, saved in
  the GCS.
- ClusterManager (autoscale/cluster_manager.py): each router replica
  (`ensure_cluster_manager`); the pools' nodes and events.
- VramProbe, one per node (autoscale/probe.py): the placer and the cluster manager
  (`start_probes`); the node's VRAM readings.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from cluster import config as config_check
from cluster import exit_deadline
from cluster.backends import build_backend, build_fallback
from cluster.ray_runtime import RayStartError, ensure_ray, start_serve
from core.config import ClusterConfig, ConfigError, load_config
from core.types import FALLBACK_BACKEND
from deployments.ingress.app import Ingress
from deployments.ingress.app import app as ingress_app
from deployments.ingress.front_options import front_actor_options
from deployments.ingress.key_routes import replica_registry
from deployments.log_options import serve_logging
from deployments.router.router import RouterDeployment


def build_app(config: ClusterConfig) -> Application:
    """The whole app: the gateway over one LLMServer deployment per backend (those off their
    model's home pool start with no replica, for the placement actor to raise) and the CPU
    fallback. Each build has a token of its own, which `make reload` publishes to
    (deployments/live_config.py) and retires a removed model's deployments by
    (autoscale/serve_scaling.py)."""
    build = uuid.uuid4().hex
    backends = {b.name: build_backend(config, b, build=build) for b in config.backends}
    backends[FALLBACK_BACKEND] = build_fallback(config, build)
    return build_gateway(config, backends, build)


def build_gateway(
    config: ClusterConfig, backends: Mapping[str, Any], build: str | None = None
) -> Application:
    """Ingress and Router over `backends`: bound deployments, or handles to running ones.
    With `gateway.router_in_ingress` the Router runs inside each ingress replica."""
    build = build or uuid.uuid4().hex
    if config.gateway.router_in_ingress:
        return build_ingress(config, None, build, backends)
    router = serve.deployment(RouterDeployment).options(
        name="router",
        num_replicas=config.gateway.router_replicas,
        max_ongoing_requests=10_000,
        ray_actor_options=front_actor_options(config.gateway_resources),
        # The ingress and the proxy already log every request; a third line per request costs
        # CPU the engines need (bench/overhead.py). The router logs what it decides.
        logging_config=serve_logging(config, enable_access_log=False),
    )
    return build_ingress(config, router.bind(config, dict(backends), build), build)


def build_ingress(
    config: ClusterConfig, router: Any, build: str, backends: Mapping[str, Any] | None = None
) -> Any:
    """The ingress deployment over a bound router, or (`router` None) running its own over
    `backends`."""
    deployment = serve.deployment(serve.ingress(ingress_app)(Ingress))
    return deployment.options(
        name="ingress",
        num_replicas=config.gateway.ingress_replicas,
        # Backpressure lives in the router; the ingress must never be the queue.
        max_ongoing_requests=10_000,
        ray_actor_options=front_actor_options(config.gateway_resources),
        logging_config=serve_logging(config),
    ).bind(config, router, None, None if backends is None else dict(backends), True,
           registry=replica_registry(config), build=build)  # fmt: skip


def _guard(config: ClusterConfig) -> None:
    """The config guard before anything starts: refusals stop the start, warnings are shown."""
    findings = [f for f in config_check.check(config) if f.level != "note"]
    for finding in findings:
        print(f"gpu-pool-serve: {finding}", file=sys.stderr)
    if any(f.level == "refuse" for f in findings):
        raise ConfigError("the config guard refused this config (above); nothing was started")


def build(args: dict[str, Any]) -> Application:
    """Serve's entry point. A broken config exits with its message, never a stack trace."""
    try:
        config = load_config(args.get("config"), overrides=args.get("overrides"))
        _guard(config)
        started_head = ensure_ray(config)
    except (ConfigError, RayStartError) as error:
        print(f"gpu-pool-serve: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    on_main_thread = threading.current_thread() is threading.main_thread()
    if exit_deadline.is_serve_run_driver(sys.argv) and on_main_thread:
        exit_deadline.arm(own_cluster=started_head)  # Ctrl-C always ends `serve run`
    try:
        start_serve(config)
    except TimeoutError as error:  # Serve's proxies never became ready
        print(f"gpu-pool-serve: Serve did not start: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if not config.api_keys:
        print("gpu-pool-serve: no API keys configured: authentication is OFF", file=sys.stderr)
    return build_app(config)
