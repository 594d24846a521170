"""Unit tests for the pure parts of cluster/ray_runtime.py (no Ray is started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.config import ClusterConfig, parse_config
from cluster.ray_runtime import RayStartError, check_pools, local_pool_resources


def make_config(pools: list[dict[str, Any]], homes: dict[str, list[str]]) -> ClusterConfig:
    models = [
        {"role": role, "source": "org/model", "context_window": 4096, "pools": pool_names}
        for role, pool_names in homes.items()
    ]
    data = {"pools": pools, "models": models, "fallback": {"source": "./f.gguf"}}
    return parse_config(data, base_dir=Path("."), environ={})


def mixed_config() -> ClusterConfig:
    return make_config(
        [
            {"name": "local", "kind": "local"},
            {"name": "mesh", "kind": "mesh", "priority": 1},
            {"name": "cloud", "kind": "cloud", "priority": 2},
        ],
        {"orchestrator": ["local", "cloud"], "reasoning": ["mesh"], "coding": ["cloud"]},
    )


def test_local_pool_resources_cover_only_local_pools() -> None:
    config = make_config(
        [
            {"name": "local", "kind": "local"},
            {"name": "desk", "kind": "local"},
            {"name": "cloud", "kind": "cloud"},
        ],
        {"orchestrator": ["local", "desk", "cloud"]},
    )
    assert local_pool_resources(config) == {"pool_local": 1.0, "pool_desk": 1.0}


def test_check_pools_passes_when_the_local_resource_exists() -> None:
    check_pools(mixed_config(), {"CPU": 4.0, "pool_local": 1.0})


def test_missing_local_home_pool_names_pool_resource_and_fix() -> None:
    with pytest.raises(RayStartError) as caught:
        check_pools(mixed_config(), {"CPU": 4.0, "pool_cloud": 1.0})
    message = str(caught.value)
    assert "pools ['local']" in message
    assert "'pool_local'" in message
    assert "ray start --head --resources" in message
    assert '"pool_local": 1' in message


def test_empty_cloud_and_mesh_pools_do_not_raise() -> None:
    config = make_config(
        [{"name": "mesh", "kind": "mesh"}, {"name": "cloud", "kind": "cloud"}],
        {"orchestrator": ["cloud"], "reasoning": ["mesh"]},
    )
    check_pools(config, {"CPU": 4.0})


def test_local_pool_that_is_no_models_home_does_not_raise() -> None:
    config = make_config(
        [{"name": "cloud", "kind": "cloud"}, {"name": "local", "kind": "local"}],
        {"orchestrator": ["cloud", "local"]},
    )
    check_pools(config, {"CPU": 4.0})


def test_every_missing_local_pool_is_named_in_one_fix() -> None:
    config = make_config(
        [{"name": "local", "kind": "local"}, {"name": "desk", "kind": "local"}],
        {"orchestrator": ["local"], "coding": ["desk"]},
    )
    with pytest.raises(RayStartError) as caught:
        check_pools(config, {"CPU": 4.0})
    assert """--resources='{"pool_local": 1, "pool_desk": 1}'""" in str(caught.value)
