"""The deployment files stay true: cluster.yaml and cluster.local.yaml valid against Ray's own
schema, and the pools in them those of the GPU example config (the KubeRay folder's:
test_kuberay_manifest.py)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

from core.config import ClusterConfig, load_config

ROOT = Path(__file__).parents[2]
SCHEMA = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
CLUSTER_YAMLS = ["ray_configs/cluster.yaml", "ray_configs/cluster.local.yaml"]


def load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / path).read_text())
    return data


def gpu_example() -> ClusterConfig:
    return load_config(ROOT / "ray_configs" / "gpu.example.yaml", environ={})


@pytest.mark.parametrize("path", CLUSTER_YAMLS)
def test_cluster_yaml_is_valid_against_rays_schema(path: str) -> None:
    jsonschema.validate(load(path), json.loads(SCHEMA.read_text()))


def pool_resources(resources: dict[str, Any]) -> set[str]:
    return {r for r in resources if r.startswith("pool_")}


def test_cluster_yaml_has_a_gpu_node_type_per_pool_and_a_head_without_one() -> None:
    cluster = load("ray_configs/cluster.yaml")
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert pool_resources(head["resources"]) == set()
    workers = [t for name, t in types.items() if name != cluster["head_node_type"]]
    assert {r for t in workers for r in pool_resources(t["resources"])} == {
        p.resource for p in gpu_example().pools
    }
    assert all(t["resources"].get("GPU", 0) >= 1 for t in workers)
    starts = " ".join(cluster["head_start_ray_commands"])
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in starts
    assert "serve start" in starts
    # Every node installs the `gpu` extra through the one install script (test_install_paths.py).
    assert any("deploy/install-node.sh gpu" in c for c in cluster["setup_commands"])


def test_the_local_cluster_has_the_test_pools_on_rays_fake_multinode_provider() -> None:
    cluster = load("ray_configs/cluster.local.yaml")
    assert cluster["provider"]["type"] == "external"
    module, _, name = cluster["provider"]["module"].rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), name), FakeMultiNodeProvider)
    assert cluster["provider"]["disable_node_updaters"] is True  # no SSH to the fake nodes
    types = cluster["available_node_types"]
    assert {r for t in types.values() for r in pool_resources(t["resources"])} == {
        "pool_local",
        "pool_cloud",
    }
