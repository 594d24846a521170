"""Unit tests for the pure parts of cluster/ray_runtime.py (no Ray is started)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from cluster.ray_runtime import (
    RayStartError,
    check_pools,
    cluster_to_join,
    local_pool_resources,
    running_local_cluster,
)
from core.config import ClusterConfig, parse_config


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


def test_a_dead_clusters_address_file_is_not_a_running_cluster(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    address_file = tmp_path / "ray_current_cluster"
    address_file.write_text(f"127.0.0.1:{port}")
    assert running_local_cluster(address_file) is None


def test_a_live_gcs_port_is_a_running_cluster(tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        address_file = tmp_path / "ray_current_cluster"
        address_file.write_text(address + "\n")
        assert running_local_cluster(address_file) == address


@pytest.mark.parametrize("content", [None, "", "not-an-address", "host:port"])
def test_no_or_garbled_address_file_is_no_cluster(tmp_path: Path, content: str | None) -> None:
    address_file = tmp_path / "ray_current_cluster"
    if content is not None:
        address_file.write_text(content)
    assert running_local_cluster(address_file) is None


def test_an_unreachable_ray_address_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(RayStartError, match="cannot reach the Ray cluster at RAY_ADDRESS"):
        cluster_to_join({"RAY_ADDRESS": f"127.0.0.1:{port}"}, tmp_path / "none")


def test_no_ray_address_and_no_running_cluster_means_start_one(tmp_path: Path) -> None:
    assert cluster_to_join({}, tmp_path / "none") is None


def test_a_reachable_ray_address_or_client_url_is_joined(tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        assert cluster_to_join({"RAY_ADDRESS": address}, tmp_path / "none") == address
    client = "ray://head.example:10001"  # Ray Client: reached by ray.init itself
    assert cluster_to_join({"RAY_ADDRESS": client}, tmp_path / "none") == client
