"""deploy/kuberay/rayservice.yaml checked against KubeRay's own RayService CRD (v1.6.2, vendored
in tests/fixtures/kuberay), not only against our config.

Unless the client asks for strict field validation, the API server prunes fields its schema
does not know, with at most a warning: a misspelt field would be dropped, not refused. So the
check is stricter: every object of the schema that lists its properties and neither allows more
nor keeps unknown fields (`x-kubernetes-preserve-unknown-fields`) refuses any other. What JSON
Schema cannot see: CEL rules (`x-kubernetes-validations`), formats such as int32, and what
`serveConfigV2` holds (a string to KubeRay; tests/unit/test_deploy_files.py reads it).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).parents[2]
CRD = ROOT / "tests" / "fixtures" / "kuberay" / "ray.io_rayservices.yaml"
CRD_SHA256 = "95c639acc20ecc3cfa425d5ad0f8a7c152a336bc16d2e0deec17b62005e67fda"
MANIFEST = ROOT / "deploy" / "kuberay" / "rayservice.yaml"


def strict(schema: Any) -> Any:
    """`schema` with unknown fields refused wherever Kubernetes would prune them. It walks only
    where schemas nest (properties, items, a schema of additional properties): `anyOf` branches
    here are int-or-string, and closing a branch would refuse its outer schema's fields."""
    if not isinstance(schema, dict):
        return schema
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            schema["additionalProperties"] = False
    for nested in ("items", "additionalProperties"):
        if isinstance(schema.get(nested), dict):
            schema[nested] = strict(schema[nested])
    return schema


@cache
def kuberays_schema() -> dict[str, Any]:
    """The CRD's `v1` schema as KubeRay ships it (1 MB of YAML: the C loader where there is one)."""
    crd = yaml.load(CRD.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [v1] = [version for version in crd["spec"]["versions"] if version["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


@cache
def rayservice_schema() -> dict[str, Any]:
    schema: dict[str, Any] = strict(kuberays_schema())
    return schema


def errors(manifest: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(rayservice_schema())
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(manifest)
    ]


def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return loaded


def test_the_vendored_crd_is_kuberays_release_unchanged() -> None:
    assert hashlib.sha256(CRD.read_bytes()).hexdigest() == CRD_SHA256


def test_the_manifest_is_a_valid_rayservice_for_kuberay() -> None:
    shipped = manifest()
    assert (shipped["apiVersion"], shipped["kind"]) == ("ray.io/v1", "RayService")
    assert errors(shipped) == []


def test_a_misspelt_field_is_refused_not_pruned() -> None:
    broken = manifest()
    broken["spec"]["rayClusterConfig"]["gcsFaultToleranceOption"] = {"redisAddress": "redis:6379"}
    assert errors(broken) == [
        "spec.rayClusterConfig: Additional properties are not allowed "
        "('gcsFaultToleranceOption' was unexpected)"
    ]
    # KubeRay's schema as it is takes it (and the API server, unless told to be strict, drops it).
    assert jsonschema.Draft7Validator(kuberays_schema()).is_valid(broken)


def test_ray_start_params_must_be_strings_as_kuberay_passes_them_on() -> None:
    broken = manifest()
    broken["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 0
    assert errors(broken) == [
        "spec.rayClusterConfig.headGroupSpec.rayStartParams.num-gpus: 0 is not of type 'string'"
    ]


def test_gcs_fault_tolerance_needs_a_redis_address() -> None:
    broken = manifest()
    broken["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"] = {
        "externalStorageNamespace": "gpu-pool-serve"
    }
    assert errors(broken) == [
        "spec.rayClusterConfig.gcsFaultToleranceOptions: 'redisAddress' is a required property"
    ]
