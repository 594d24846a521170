"""LoRA adapters from the config, loaded by Ray Serve LLM's multiplexing.

Ray Serve LLM loads an adapter on a replica the first time a request asks for it
(`multiplexed_model_id`) and keeps up to `max_num_adapters_per_replica` there, and Serve routes
later requests for it to the replicas that have it. Its own loader only fetches adapters from one
cloud folder (`dynamic_lora_loading_path`); ours serves each adapter from its configured source:
a local PEFT folder as it is, a remote folder through Ray's own download. The sources reach the
replica in its environment (ADAPTERS_ENV, JSON: name -> source), set by cluster/backends.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ray.llm._internal.common.models import global_id_manager
from ray.llm._internal.common.utils.cloud_utils import LoraMirrorConfig
from ray.llm._internal.common.utils.lora_utils import clean_model_id
from ray.llm._internal.serve.core.configs.llm_config import DiskMultiplexConfig
from ray.llm._internal.serve.utils.lora_serve_utils import LoraModelLoader

__all__ = ["ADAPTERS_ENV", "ConfiguredAdapterLoader", "adapter_sources"]

ADAPTERS_ENV = "GPS_LORA_ADAPTERS"


def adapter_sources() -> dict[str, str]:
    """This replica's adapters, by name: a local folder or a remote URI."""
    found: dict[str, str] = json.loads(os.environ.get(ADAPTERS_ENV) or "{}")
    return found


class ConfiguredAdapterLoader(LoraModelLoader):  # type: ignore[misc]
    """Ray's loader, fed from the config instead of one cloud folder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sources = adapter_sources()
        self._local: dict[str, DiskMultiplexConfig] = {}

    async def load_model_from_config(
        self, lora_model_id: str, llm_config: Any
    ) -> DiskMultiplexConfig:
        source = self._sources.get(lora_model_id)
        if source is None:
            raise ValueError(f"{lora_model_id!r} is not an adapter of this model")
        max_tokens = llm_config.max_request_context_length
        if "://" in source:  # Ray's download, into its disk cache
            mirror = LoraMirrorConfig(
                lora_model_id=lora_model_id, bucket_uri=source, max_total_tokens=max_tokens
            )
            loaded: DiskMultiplexConfig = await self.load_model(lora_model_id, mirror)
            return loaded
        if lora_model_id not in self._local:  # one id per adapter for vLLM's LoRA slots
            self._local[lora_model_id] = DiskMultiplexConfig(
                model_id=lora_model_id,
                max_total_tokens=max_tokens,
                local_path=source,
                lora_assigned_int_id=global_id_manager.next(),
            )
        return self._local[lora_model_id]

    def _model_dir_path(self, model_id: str) -> str:
        """A cache folder per adapter name. Ray's keeps only what follows a `:` in the id (its
        ids are `base:adapter`), so names like ours would all share the cache's root."""
        path = os.path.join(str(self.lora_root), str(clean_model_id(model_id)))
        os.makedirs(path, exist_ok=True)
        return path
