"""Where a chat with images goes: to a model that reads them (`models[].images`, else its
config.json), never to one that would drop or refuse them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.backends import fallback_settings
from core.config import ClusterConfig, ConfigError, parse_config
from core.errors import ApiError
from core.types import PriorityClass
from deployments.fallback.replica import NoEngine, choose_engine
from deployments.ingress.auth import Caller
from deployments.ingress.jobs import Jobs

# A 1x1 PNG.
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PICTURE = [
    {"type": "image_url", "image_url": {"url": PNG}},
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


def test_auto_with_images_skips_the_depth_router_and_counting_follows_the_images(
    tmp_path: Path,
) -> None:
    jobs = Jobs(config(True, tmp_path))
    body = {"model": "auto", "messages": [{"role": "user", "content": PICTURE}]}
    # A quick question would have had a quarter of a text model's window.
    job, depth = jobs.chat(body, ANYONE, None, "quick")
    assert (job.model, job.context_share, depth) == ("vision", 1.0, None)
    # Anthropic's count_tokens counts with the model that would read the images.
    assert jobs.counted_model({**body, "model": "orchestrator"}, ANYONE) == "vision"
    assert jobs.counted_model(body, ANYONE) == "vision"


def test_a_model_that_reads_images_keeps_them(tmp_path: Path) -> None:
    folder = tmp_path / "coding"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vision_config": {"hidden_size": 8}}))
    cluster = config(False, tmp_path)
    assert cluster.reads_images(cluster.model_named("coding"))  # read from its config.json
    assert chat_to(Jobs(cluster), "coding") == "coding"


def test_a_vision_model_whose_config_cannot_be_read_here_is_taken_at_its_role(
    tmp_path: Path,
) -> None:
    # A hub id not in this node's Hugging Face cache (nothing is downloaded to decide).
    assert chat_to(Jobs(config(None, tmp_path)), "orchestrator") == "vision"


def test_no_model_that_reads_images_is_a_400_that_says_so(tmp_path: Path) -> None:
    with pytest.raises(ApiError) as refused:
        chat_to(Jobs(config(False, tmp_path)), "orchestrator")
    assert refused.value.status == 400
    assert "no model here reads them" in refused.value.message
    assert refused.value.param == "messages"


def test_the_loader_settles_who_reads_images_once(tmp_path: Path) -> None:
    # A vision model whose config.json keeps its tower elsewhere (Phi-3-vision's) reads images
    # by its role; a text model's config.json says nothing either, and its role decides.
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "config.json").write_text(json.dumps({"model_type": "phi3_v"}))
    settled = config(None, tmp_path)
    assert [(m.name, m.images) for m in settled.models] == [
        ("orchestrator", False),
        ("coding", False),
        ("vision", True),
    ]


def fallback_config(tmp_path: Path, **fallback: Any) -> ClusterConfig:
    raw = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [
            {
                "role": "vision",
                "source": str(tmp_path / "vision"),
                "context_window": 4096,
                "pools": ["local"],
            }
        ],
        "fallback": {"source": "fallback.gguf", **fallback},
    }
    return parse_config(raw, base_dir=tmp_path, environ={})


def test_a_fallback_with_a_projector_reads_images_on_llama_server(tmp_path: Path) -> None:
    plain = fallback_config(tmp_path)
    assert not plain.fallback_target.images
    assert plain.targets["vision@local"].images  # the chain's only reader
    reading = fallback_config(tmp_path, mmproj="fallback.mmproj.gguf")
    assert reading.fallback_target.images
    assert fallback_settings(reading).mmproj == str(tmp_path / "fallback.mmproj.gguf")
    # Only llama-server reads them: auto chooses it, whatever else the node has.
    server = "/venv/bin/llama-server"
    chosen = choose_engine("auto", "/usr/bin/ollama", True, llama_server_binary=server,
                           reads_images=True)  # fmt: skip
    assert chosen == "llama_server"
    with pytest.raises(NoEngine, match="only llama-server reads images"):
        choose_engine("auto", "/usr/bin/ollama", True, reads_images=True)


def test_a_projector_for_an_engine_that_reads_no_images_is_refused(tmp_path: Path) -> None:
    for engine in ("ollama", "llama_cpp"):
        with pytest.raises(ConfigError, match=f"mmproj: the {engine} engine reads no images"):
            fallback_config(tmp_path, engine=engine, mmproj="fallback.mmproj.gguf")
    with pytest.raises(ConfigError, match=r"projector \.gguf"):
        fallback_config(tmp_path, mmproj="fallback.mmproj.bin")
