"""A replica of a model whose weights need no download starts without Ray Serve LLM's node
initialization task (deployments/engine/node_init.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from ray.llm._internal.common.utils.import_utils import load_class

from cluster.backends import llm_config_for
from core.config import parse_config
from core.topology import Backend
from deployments.engine.node_init import CALLBACK_PATH, SkipNodeInit

E2E = Path(__file__).parents[1] / "e2e"


def coding_config_from(source: str) -> Any:
    raw: dict[str, Any] = yaml.safe_load((E2E / "gateway.yaml").read_text())
    [coding] = [m for m in raw["models"] if m.get("role") == "coding"]
    coding["source"] = source
    config = parse_config(raw, base_dir=E2E, environ={})
    return llm_config_for(config, Backend(model=coding.get("name", "coding"), pool="local"))


def test_a_local_or_hub_source_skips_the_download_task_and_a_bucket_keeps_it() -> None:
    for source in ("../../.models/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        built = coding_config_from(source)
        assert load_class(built.callback_config.callback_class) is SkipNodeInit, source
    bucket = coding_config_from("s3://models/SmolLM2-135M-Instruct")
    assert bucket.callback_config.callback_class is not SkipNodeInit
    assert bucket.callback_config.callback_class != CALLBACK_PATH


def test_the_callback_turns_the_node_initialization_off() -> None:
    callback = SkipNodeInit(llm_config=coding_config_from("HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert callback.ctx.run_init_node  # Ray's default
    asyncio.run(callback.run_callback("on_before_node_init"))
    assert not callback.ctx.run_init_node
