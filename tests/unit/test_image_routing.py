"""Where a chat with images goes: to a model that reads them (`models[].images`, else its
config.json), never to one that would drop or refuse them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.config import ClusterConfig, parse_config
from core.errors import ApiError
from core.types import PriorityClass
from deployments.ingress.auth import Caller
from deployments.ingress.jobs import Jobs

PICTURE = [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "text", "text": "What is this?"},
]
ANYONE = Caller("anyone", PriorityClass.USER, PriorityClass.USER)


def config(vision_reads: bool | None, tmp_path: Path) -> ClusterConfig:
    def model(role: str, **extra: Any) -> dict[str, Any]:
        return {"role": role, "source": str(tmp_path / role), "context_window": 4096,
                "pools": ["local"], **extra}  # fmt: skip

    vision = model("vision") if vision_reads is None else model("vision", images=vision_reads)
    raw = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [model("orchestrator"), model("coding"), vision],
        "fallback": {"source": "fallback.gguf", "context_window": 2048},
    }
    return parse_config(raw, base_dir=tmp_path, environ={})


def chat_to(jobs: Jobs, model: str, content: Any = PICTURE) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    job, _ = jobs.chat(body, ANYONE, None, None)
    return job.model


def test_images_go_to_the_vision_model_whatever_text_model_was_asked(tmp_path: Path) -> None:
    jobs = Jobs(config(True, tmp_path))
    assert chat_to(jobs, "orchestrator") == "vision"
    assert chat_to(jobs, "vision") == "vision"
    assert chat_to(jobs, "auto") == "vision"  # the depth router's choice reads no images
    assert chat_to(jobs, "orchestrator", "Text only.") == "orchestrator"


def test_a_model_that_reads_images_keeps_them(tmp_path: Path) -> None:
    folder = tmp_path / "coding"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vision_config": {"hidden_size": 8}}))
    cluster = config(False, tmp_path)
    assert cluster.reads_images(cluster.model_named("coding"))  # read from its config.json
    assert chat_to(Jobs(cluster), "coding") == "coding"


@pytest.mark.parametrize("vision_reads", [False, None])
def test_no_model_that_reads_images_is_a_400_that_says_so(
    vision_reads: bool | None, tmp_path: Path
) -> None:
    # None: vision's folder holds no config.json, so it is taken for a text model.
    with pytest.raises(ApiError) as refused:
        chat_to(Jobs(config(vision_reads, tmp_path)), "orchestrator")
    assert refused.value.status == 400
    assert "no model here reads them" in refused.value.message
    assert refused.value.param == "messages"
