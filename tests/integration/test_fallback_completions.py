"""`/v1/completions` on the CPU fallback, on the real llama.cpp engine and the demo model's GGUF:
a raw prompt (no chat template), whole and streamed, echo, token ids, and what it refuses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.answers import EngineError
from core.requests import CompletionRequest
from deployments.fallback.replica import CpuFallback, FallbackSettings
from policy.context.tokens import ChatTemplateCounter

GGUF = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run `make model` (make test does it)")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is part of the cpu extra")
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module", params=["llama_cpp", "llama_server"])
def fallback(
    loop: asyncio.AbstractEventLoop, request: pytest.FixtureRequest
) -> Iterator[CpuFallback]:
    """Both llama.cpp engines: the Python server and llama.cpp's own."""
    settings = FallbackSettings(
        engine=request.param,
        source=str(GGUF),
        model_id="cpu-fallback",
        context_window=256,
        threads=1,
        ollama_model="unused",
        keep_alive="1m",
    )
    replica = CpuFallback.__new__(CpuFallback)
    loop.run_until_complete(CpuFallback.__init__(replica, settings))  # Serve awaits it
    yield replica
    loop.run_until_complete(replica.aclose())


def complete(loop: asyncio.AbstractEventLoop, replica: CpuFallback, **fields: Any) -> list[Any]:
    request = CompletionRequest(model="cpu-fallback", **{"temperature": 0.0, **fields})

    async def run() -> list[Any]:
        return [item async for item in replica.completions(request)]

    return loop.run_until_complete(run())


def test_a_whole_completion_counts_the_raw_prompt_exactly(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    [response] = complete(loop, fallback, prompt=PROMPT, max_tokens=8)
    body = response.body
    assert body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    assert choice["text"]
    assert choice["finish_reason"] == "length"
    counter = ChatTemplateCounter.from_pretrained(GGUF)
    assert body["usage"]["prompt_tokens"] == counter.count_raw(PROMPT)  # no template around it
    assert body["usage"]["completion_tokens"] == 8


def test_a_streamed_completion_echoes_the_prompt_and_ends_with_usage_and_done(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    items = complete(
        loop,
        fallback,
        prompt=PROMPT,
        max_tokens=6,
        echo=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    lines = [line for item in items for line in item]
    assert lines[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text.startswith(PROMPT)
    assert len(text) > len(PROMPT)
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_token_ids_are_a_prompt_too(loop: asyncio.AbstractEventLoop, fallback: CpuFallback) -> None:
    ids = ChatTemplateCounter.from_pretrained(GGUF)._tokenizer.encode(PROMPT)
    [response] = complete(loop, fallback, prompt=ids, max_tokens=4, echo=True)
    body = response.body
    assert body["choices"][0]["text"].startswith("def fibonacci")
    assert body["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"prompt": "word " * 400}, "exceed context window"),
        ({"prompt": PROMPT, "logprobs": 2}, "no logprobs"),
        ({"prompt": [10**7]}, "outside the vocabulary"),
    ],
)
def test_what_it_cannot_do_is_the_clients_400(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback, fields: dict[str, Any], says: str
) -> None:
    [refusal] = complete(loop, fallback, **fields)
    assert isinstance(refusal, EngineError)
    assert refusal.code == 400
    assert says in refusal.message
