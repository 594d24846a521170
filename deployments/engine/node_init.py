"""A model whose weights need no download skips Ray Serve LLM's node initialization.

Before a replica's vLLM engine starts, `ray.serve.llm` runs `initialize_node`: a Ray task on each
node of the replica's placement group that calls `download_model_files`. For a source that is not
a cloud bucket (a local directory, or a Hugging Face id, which vLLM fetches itself) that function
returns the source unchanged, yet the task is a fresh Ray worker process that imports torch and
Ray LLM first: 87 s from its start to its answer on a loaded 2-core machine (2026-11-27), in the
path of every replica's start and replacement. Ray's own seam turns it off
(`LLMConfig.callback_config`, `CallbackCtx.run_init_node`); a bucket source keeps it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase
from ray.llm._internal.common.utils.cloud_utils import is_remote_path

CALLBACK_PATH = "deployments.engine.node_init.SkipNodeInit"


class SkipNodeInit(CallbackBase):  # type: ignore[misc]
    """Ray LLM's callback: no node initialization task for this replica."""

    async def on_before_node_init(self) -> None:
        self.ctx.run_init_node = False
        # What the skipped task also did: torch cannot create its kernels folder without it.
        import torch

        (Path(torch.hub.get_dir()).parent / "kernels").mkdir(parents=True, exist_ok=True)


def node_init_config(source: str) -> dict[str, Any]:
    """The LLMConfig keys for a model loaded from `source`: none for a cloud bucket, which
    the task downloads to each node."""
    return {} if is_remote_path(source) else {"callback_config": {"callback_class": CALLBACK_PATH}}
