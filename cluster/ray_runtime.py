"""Connect to Ray, or start a local head that carries the local pools' resources."""

from __future__ import annotations

import os

import ray

from cluster.config import ClusterConfig, PoolKind

SERVE_NAMESPACE = "serve"


class RayStartError(RuntimeError):
    pass


def local_pool_resources(config: ClusterConfig) -> dict[str, float]:
    return {p.resource: 1.0 for p in config.pools if p.kind == PoolKind.LOCAL}


def ensure_ray(config: ClusterConfig) -> None:
    """Join the running cluster (RAY_ADDRESS or `ray start`), else start one on this machine.

    A head we start ourselves carries `pool_<name>` for every local pool, so plain
    `serve run cluster.app:build` works on a laptop with no `ray start` first.
    """
    if not ray.is_initialized():
        try:
            ray.init(address="auto", namespace=SERVE_NAMESPACE)
        except ConnectionError as error:
            if os.environ.get("RAY_ADDRESS"):
                raise RayStartError(
                    f"cannot reach the Ray cluster at RAY_ADDRESS: {error}"
                ) from None
            ray.init(namespace=SERVE_NAMESPACE, resources=local_pool_resources(config))
    check_pools(config, ray.cluster_resources())


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
