"""The config's JSON Schema (ray_configs/gps-config.schema.json) and its reference
(docs/configuration.md): current with the config models, the schema named at the top of the
example configs and faithful to what the loader accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cluster.config import SCHEMA_FILE, json_schema, schema
from cluster.config_docs import DOCS_FILE, reference
from core.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [ROOT / "ray_configs" / "local.yaml", ROOT / "ray_configs" / "gpu.example.yaml"]
# Every config of ours in the repository: anything the loader is fed here, the schema accepts.
CONFIGS = sorted(
    p
    for pattern in ("ray_configs/*.yaml", "tests/*/*.yaml", "bench/*.yaml")
    for p in ROOT.glob(pattern)
    if "models" in (yaml.safe_load(p.read_text()) or {})
)


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))


def test_the_checked_in_schema_is_the_config_models_own() -> None:
    assert SCHEMA_FILE.read_text() == json_schema(), (
        "the config models changed: run `python -m cluster.config schema > "
        "ray_configs/gps-config.schema.json`"
    )


def test_the_reference_is_the_config_models_own() -> None:
    assert DOCS_FILE.read_text() == reference(schema()), (
        "the config models changed: run `python -m cluster.config docs > docs/configuration.md`"
    )


def every_key(model: type[Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, its pydantic field) for every key of the file, through nested sections."""
    keys = []
    for name, field in model.model_fields.items():
        if name == "base_dir":  # the loader's, never written in a file
            continue
        keys.append((f"{prefix}{name}", field))
        for kind in [field.annotation, *getattr(field.annotation, "__args__", ())]:
            if isinstance(kind, type) and hasattr(kind, "model_fields"):
                keys += every_key(kind, f"{prefix}{name}.")
    return keys


def test_every_key_is_described_and_in_the_reference() -> None:
    text = DOCS_FILE.read_text()
    keys = every_key(ClusterConfig)
    assert len(keys) > 100
    missing = [key for key, _ in keys if f"| `{key.rsplit('.', 1)[-1]}` |" not in text]
    assert missing == [], "not in docs/configuration.md"
    undescribed = [key for key, field in keys if not field.description]
    assert undescribed == [], "give these config fields a description"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_config_names_the_schema_for_editors(example: Path) -> None:
    first = example.read_text().splitlines()[0]
    assert first == f"# yaml-language-server: $schema={SCHEMA_FILE.name}"
    assert (example.parent / SCHEMA_FILE.name).is_file()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_in_the_repository_passes_the_schema(config: Path) -> None:
    errors = [e.message for e in validator().iter_errors(yaml.safe_load(config.read_text()))]
    assert errors == []


def test_a_misspelled_or_out_of_range_key_is_flagged() -> None:
    data: dict[str, Any] = yaml.safe_load(EXAMPLES[0].read_text())
    data["router"] = {"max_queueue": 3, "breaker_failures": 0}
    data["fallback"] = {**data["fallback"], "provisioner": "ray_autoscaler"}
    messages = sorted(e.message for e in validator().iter_errors(data))
    assert len(messages) == 3
    assert any("max_queueue" in m for m in messages)
    assert any("0 is less than the minimum of 1" in m for m in messages)
