"""A model's geometry read from its files: config.json and the size of its weights.

A local folder is read as it is; a hub id only from the local Hugging Face cache (nothing is
downloaded to check a config). What cannot be read comes back as the reason, for the guard to
report as a note.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.config import ClusterConfig
from policy.engine_memory import ModelGeometry, geometry_from_hf_config

__all__ = ["model_geometries", "read_geometry"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def model_geometries(config: ClusterConfig) -> dict[int, ModelGeometry | str]:
    return {i: read_geometry(config.resolve_path(m.source)) for i, m in enumerate(config.models)}


def read_geometry(source: str) -> ModelGeometry | str:
    folder = _local_folder(source)
    if folder is None:
        return f"{source} is neither a local folder nor in the local Hugging Face cache"
    try:
        config = json.loads((folder / "config.json").read_text())
        weights = sum(
            f.stat().st_size
            for f in folder.iterdir()
            if f.suffix in WEIGHT_SUFFIXES and f.is_file()
        )
        if weights == 0:
            return f"{folder} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})"
        return geometry_from_hf_config(config, weights)
    except (OSError, ValueError) as error:
        return f"cannot read {folder / 'config.json'}: {error}"


def _local_folder(source: str) -> Path | None:
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(source, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None
