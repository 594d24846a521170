"""The model cards `/v1/models` lists and `/v1/models/{id}` answers: every name a client may send
(a model's name, its aliases, a role's name, `auto`), each saying which model it reaches."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from core.config import ClusterConfig

__all__ = ["OWNER", "model_cards"]

OWNER = "gpu-pool-serve"


def model_cards(
    config: ClusterConfig, served: Mapping[str, str | None], created: int | None = None
) -> dict[str, dict[str, Any]]:
    """A card per served name (OpenAI's `id`, `object`, `created`, `owned_by`; vLLM's `root`,
    the weights, and `parent`, an adapter's base model), with the model it reaches, that
    model's role and aliases, and what it reads (`input_modalities`, as OpenRouter lists them:
    "image" where its engine reads images). `auto`'s model is chosen per request: none; it
    reads images where some model does (they go there)."""
    stamp = int(time.time()) if created is None else created
    readers = {m.name for m in config.models if config.reads_images(m)}
    sources = {a.name: a.source for m in config.models for a in m.adapters}
    cards = {}
    for name, model_name in served.items():
        base = config.base_model(model_name) if model_name is not None else None
        adapter = sources.get(model_name) if model_name is not None else None
        cards[name] = {
            "id": name,
            "object": "model",
            "created": stamp,
            "owned_by": OWNER,
            "root": adapter or (base.source if base else None),
            "parent": base.name if adapter is not None and base else None,
            "model": model_name,
            "role": base.role.value if base and base.role else None,
            "aliases": list(base.aliases) if base and adapter is None else [],
            "input_modalities": ["text", "image"]
            if (base.name in readers if base else bool(readers))
            else ["text"],
        }
    return cards
