"""deploy/kuberay holds together: the app its RayService serves is a valid config laid out for
that cluster (pools as worker groups, the gateway on its own group with proxies there, its state
on the volume), the GCS's Redis is the one the folder starts, clients reach gateway pods only,
and one image name is set for every container. tests/unit/test_kuberay_schema.py checks the
RayService against KubeRay's own schema."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from core.config import ClusterConfig, load_config

ROOT = Path(__file__).parents[2]
FOLDER = ROOT / "deploy" / "kuberay"
GPU_DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile.gpu"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text()) if d]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    """The folder's one resource of `kind` (named `name`), whichever file holds it."""
    found = [
        d
        for file in kustomization()["resources"]
        for d in documents(file)
        if d["kind"] == kind and name in (None, d["metadata"]["name"])
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


@cache
def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())
    return loaded


def cluster() -> dict[str, Any]:
    spec: dict[str, Any] = one("RayService")["spec"]["rayClusterConfig"]
    return spec


def groups() -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in cluster()["workerGroupSpecs"]}


def ray_resources(group: dict[str, Any]) -> set[str]:
    # KubeRay passes the value to `ray start --resources=` as is: a quoted JSON string.
    raw = group["rayStartParams"].get("resources")
    return set(json.loads(json.loads(raw))) if raw else set()


def containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = group["template"]["spec"]["containers"]
    return found


def serve_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(one("RayService")["spec"]["serveConfigV2"])
    return loaded


def image_workdir() -> PurePosixPath:
    [workdir] = re.findall(r"^WORKDIR\s+(\S+)", GPU_DOCKERFILE.read_text(), re.MULTILINE)
    return PurePosixPath(workdir)


def served_config() -> ClusterConfig:
    """The app's config as the image's path names it, with the manifest's overrides."""
    [app] = serve_config()["applications"]
    assert app["import_path"] == "cluster.app:build"
    in_image = PurePosixPath(app["args"]["config"])
    in_repo = ROOT / in_image.relative_to(image_workdir())
    return load_config(in_repo, environ={}, overrides=app["args"]["overrides"])


def test_every_file_is_applied_and_every_container_takes_the_image_set_once() -> None:
    files = {p.name for p in FOLDER.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization()["resources"]) == files
    [image] = kustomization()["images"]
    every = [cluster()["headGroupSpec"], *groups().values()]
    assert {c["image"] for group in every for c in containers(group)} == {image["name"]}


def test_the_pools_are_gpu_groups_and_the_gateway_a_group_of_its_own() -> None:
    config = served_config()
    pool_groups = {name: g for name, g in groups().items() if name != "gateway"}
    assert {name: ray_resources(g) for name, g in pool_groups.items()} == {
        p.name: {p.resource} for p in config.pools
    }
    for group in pool_groups.values():
        assert int(containers(group)[0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert ray_resources(groups()["gateway"]) == {config.gateway.resource}
    # One pod per ingress replica (rayservice.yaml says why).
    assert groups()["gateway"]["maxReplicas"] == config.gateway.ingress_replicas
    assert "nvidia.com/gpu" not in containers(groups()["gateway"])[0]["resources"]["limits"]
    assert "resources" not in cluster()["headGroupSpec"]["rayStartParams"]
    assert cluster()["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_clients_reach_the_gateway_pods_proxies_only() -> None:
    assert serve_config()["proxy_location"] == served_config().gateway.proxy_location
    assert served_config().gateway.proxy_location == "EveryNode"
    selector = one("Service", "gpu-pool-serve-gateway")["spec"]["selector"].items()
    labels = {
        name: g["template"].get("metadata", {}).get("labels", {}) for name, g in groups().items()
    }
    labels["head"] = cluster()["headGroupSpec"]["template"].get("metadata", {}).get("labels", {})
    assert [name for name, carried in labels.items() if selector <= carried.items()] == ["gateway"]


def test_the_gcs_keeps_its_tables_in_the_folders_redis() -> None:
    options = cluster()["gcsFaultToleranceOptions"]
    host, _, port = options["redisAddress"].partition(":")
    redis = one("Service", host)
    assert int(port) in [p["port"] for p in redis["spec"]["ports"]]
    secret = options["redisPassword"]["valueFrom"]["secretKeyRef"]
    # No password in the folder: kustomize makes the Secret from a file git ignores.
    [generated] = kustomization()["secretGenerator"]
    assert generated["name"] == secret["name"]
    assert secret["key"] == "password"  # the file's one line: password=...
    assert generated["envs"] == ["redis-password.env"]
    assert "redis-password.env" in (FOLDER / ".gitignore").read_text().split()
    assert "externalStorageNamespace" not in options  # per cluster, KubeRay's default


def test_the_gateways_state_is_on_a_volume_every_gateway_pod_mounts() -> None:
    config = served_config()
    pod = groups()["gateway"]["template"]["spec"]
    [mount] = containers(groups()["gateway"])[0]["volumeMounts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = one("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for path in (config.batches.directory, config.keys_db):
        assert path.is_relative_to(mount["mountPath"]), path
    assert config.batches.shared_storage  # SQLite's rollback journal on a network filesystem
