"""Whether a model's engine reads images, where its config does not say (`models[].images`).

Read from the model's own config.json: a vision-language model's has a `vision_config` (Idefics3,
LLaVA, Qwen2-VL, Gemma 3, ...). A local folder is read as it is, a hub id only from the local
Hugging Face cache (nothing is downloaded to decide). Where neither holds it, or it names no
`vision_config` (some vision models, Phi-3-vision's, keep theirs elsewhere), None: the model's
role decides (ClusterConfig.reads_images). The loader settles it once (load.py), so every
process the config is pickled to routes alike.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["config_reads_images"]


def config_reads_images(source: str) -> bool | None:
    folder = Path(source).expanduser()
    config = folder / "config.json" if folder.is_dir() else _cached_config(source)
    if config is None:
        return None
    try:
        settings = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(settings, dict) and isinstance(settings.get("vision_config"), dict):
        return True
    return None


def _cached_config(source: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(source, "config.json")
    except ValueError:  # not a repository id (a path that does not exist)
        return None
    return Path(cached) if isinstance(cached, str) else None
