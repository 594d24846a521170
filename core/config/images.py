"""Whether a model's engine reads images, where its config does not say (`models[].images`).

Read from the model's own config.json: a vision-language model's has a `vision_config` (Idefics3,
LLaVA, Qwen2-VL, Gemma 3, ...). A local folder is read as it is, a hub id only from the local
Hugging Face cache (nothing is downloaded to decide); where neither holds it, None: the model's
role decides (ClusterConfig.reads_images).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["config_reads_images"]


@functools.lru_cache(maxsize=64)  # a config is read once, not at every target built from it
def config_reads_images(source: str) -> bool | None:
    folder = Path(source).expanduser()
    config = folder / "config.json" if folder.is_dir() else _cached_config(source)
    if config is None:
        return None
    try:
        settings = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    return isinstance(settings, dict) and isinstance(settings.get("vision_config"), dict)


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
