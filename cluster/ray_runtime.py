"""Connect to Ray, or start a local head that carries the local pools' resources."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import ray
from ray import serve
from ray._common.utils import get_ray_address_file

from cluster.ray_start import start_retrying
from core.config import ClusterConfig
from core.types import PoolKind

SERVE_NAMESPACE = "serve"
# A GCS on this machine or the LAN answers a TCP connect in milliseconds.
GCS_CONNECT_TIMEOUT_S = 2.0


class RayStartError(RuntimeError):
    pass


def local_pool_resources(config: ClusterConfig) -> dict[str, float]:
    return {p.resource: 1.0 for p in config.pools if p.kind == PoolKind.LOCAL}


def gcs_answers(address: str, timeout_s: float = GCS_CONNECT_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection at `host:port`."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def running_local_cluster(address_file: Path | None = None) -> str | None:
    """The address of the cluster `ray start` or `ray.init` last started here, if it still runs.

    Ray remembers that address in a file it does not remove when the cluster is killed; a
    plain `ray.init()` then treats the dead address as a running cluster and either refuses
    our resources or waits minutes for a GCS that is gone.
    """
    path = address_file or Path(get_ray_address_file(None))
    try:
        address = path.read_text().strip()
    except OSError:
        return None
    return address if address and gcs_answers(address) else None


def cluster_to_join(environ: Mapping[str, str], address_file: Path | None = None) -> str | None:
    """The cluster `serve run` joins (RAY_ADDRESS, else a running `ray start` head on this
    machine), or None to start one. An unreachable RAY_ADDRESS fails now, not after minutes."""
    given = environ.get("RAY_ADDRESS")
    if not given:
        return running_local_cluster(address_file)
    address = running_local_cluster(address_file) if given == "auto" else given
    if not address or not (address.startswith("ray://") or gcs_answers(address)):
        raise RayStartError(f"cannot reach the Ray cluster at RAY_ADDRESS={given}")
    return address


def ensure_ray(config: ClusterConfig) -> bool:
    """Join the running cluster, else start one on this machine; True when this process
    started it (the cluster then ends with this process).

    A head we start ourselves carries `pool_<name>` for every local pool, so plain
    `serve run cluster.app:build` works on a laptop with no `ray start` first.
    """
    started = False
    if not ray.is_initialized():
        if address := cluster_to_join(os.environ):
            # A GCS address goes as "auto": it resolves to the same one (RAY_ADDRESS, else the
            # file just probed) and also finds the token a `ray start` cluster requires.
            given = address if address.startswith("ray://") else "auto"
            ray.init(address=given, namespace=SERVE_NAMESPACE)
        else:
            # Patient: on a busy machine (a container started beside other work) the raylet
            # may register after Ray's fixed 30 s (cluster/ray_start.py).
            start_retrying(
                lambda: ray.init(
                    address="local",
                    namespace=SERVE_NAMESPACE,
                    resources=local_pool_resources(config),
                )
            )
            started = True
    check_pools(config, ray.cluster_resources())
    return started


def start_serve(config: ClusterConfig, http_options: dict[str, object] | None = None) -> None:
    """Serve with its proxies where `gateway.proxy_location` says, before the app deploys: a
    Serve already running (`serve start`, a RayService, an earlier app) keeps its own. Started
    ahead of the engines, the proxies pass their readiness checks before the engines take
    the cores (docs/design.md, environment facts)."""
    serve.start(proxy_location=config.gateway.proxy_location, http_options=http_options)


def this_cluster() -> str:
    """The GCS address of the cluster this process joined. Ray's state API, given none, reads
    the address file, which may name a dead cluster (or another one)."""
    return str(ray.get_runtime_context().gcs_address)


def check_pools(config: ClusterConfig, resources: dict[str, float]) -> None:
    """Fail fast when a local pool has no node: its replicas would wait forever.

    Mesh and cloud pools may be empty at start (an autoscaler or `terraform apply` adds nodes).
    """
    homes = {b.pool for b in config.home_backends}
    missing = [
        p
        for p in config.pools
        if p.name in homes and p.kind == PoolKind.LOCAL and p.resource not in resources
    ]
    if missing:
        resources_arg = ", ".join(f'"{p.resource}": 1' for p in missing)
        raise RayStartError(
            f"pools {[p.name for p in missing]}: no Ray node carries "
            f"{[p.resource for p in missing]}. Start the head with "
            f"`ray start --head --resources='{{{resources_arg}}}'` "
            "or stop the running cluster (`ray stop`) and let serve run start one."
        )
