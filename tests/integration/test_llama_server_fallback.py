"""The CPU fallback on llama.cpp's own `llama-server` (built by make install from the pinned
source, a supervised child process) and the demo model's GGUF, without Serve: answers and exact
counts, continued and resumed answers, several decoded at once, a client that leaves, a killed
server, a killed replica."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.answers import EngineError
from core.requests import ChatRequest
from deployments.fallback.engine import ChatParams, Finish, Piece
from deployments.fallback.llama_server_engine import LlamaServerEngine
from deployments.fallback.replica import CpuFallback, FallbackSettings, llama_server_binary
from policy.context.tokens import ChatTemplateCounter

GGUF = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WINDOW = 512
PARALLEL = 4
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Count from one to fifty, in words."},
]
# The model answers MESSAGES in 11 tokens; this one runs to its budget (CI saw a short answer
# finish before the last stream had begun).
LONG_MESSAGES = [{"role": "user", "content": "Write a long story about a dragon who bakes bread."}]


def binary() -> str:
    found = llama_server_binary()
    if found is None:
        pytest.fail("no llama-server beside this Python: run `make install` (make test does it)")
    return found


def new_engine(**overrides: Any) -> LlamaServerEngine:
    options: dict[str, Any] = {
        "binary": binary(),
        "model_path": str(GGUF),
        "context_window": WINDOW,
        "threads": 1,
        "parallel": PARALLEL,
        "sleep": lambda _: asyncio.sleep(0),  # restart at once in tests
    }
    return LlamaServerEngine(**{**options, **overrides})


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run `make model` (make test does it)")
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module")
def fallback(loop: asyncio.AbstractEventLoop) -> Iterator[CpuFallback]:
    settings = FallbackSettings(
        engine="llama_server",
        source=str(GGUF),
        model_id="cpu-fallback",
        context_window=WINDOW,
        threads=1,
        ollama_model="unused",
        keep_alive="1m",
        parallel=PARALLEL,
    )
    replica = CpuFallback.__new__(CpuFallback)
    loop.run_until_complete(CpuFallback.__init__(replica, settings))  # Serve awaits it
    yield replica
    loop.run_until_complete(replica.aclose())


def ask(loop: asyncio.AbstractEventLoop, replica: CpuFallback, **fields: Any) -> list[Any]:
    request = ChatRequest(model="cpu-fallback", **{"messages": MESSAGES, **fields})

    async def run() -> list[Any]:
        return [item async for item in replica.chat(request)]

    return loop.run_until_complete(run())


def test_a_whole_answer_has_text_and_the_exact_counts(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    [response] = ask(loop, fallback, max_tokens=8, temperature=0.0)
    body = response.body
    assert body["choices"][0]["message"]["content"].strip()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8
    # The router counts with the GGUF's own tokenizer and template: the same number.
    counter = ChatTemplateCounter.from_pretrained(GGUF)
    assert body["usage"]["prompt_tokens"] == counter.count_prompt(MESSAGES)


def test_an_answer_that_stops_counts_what_it_said(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    """A stop string is not in the text, nor is the token that completed it counted."""
    [response] = ask(loop, fallback, max_tokens=64, temperature=0.0, stop=[","])
    body = response.body
    assert body["choices"][0]["finish_reason"] == "stop"
    counter = ChatTemplateCounter.from_pretrained(GGUF)
    said = counter.count_text(body["choices"][0]["message"]["content"])
    assert abs(body["usage"]["completion_tokens"] - said) <= 1  # a leading space may merge


def test_a_cut_answer_is_continued_and_only_new_tokens_count(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    cut = {"role": "assistant", "content": "One, two, three,"}
    [response] = ask(
        loop,
        fallback,
        messages=[*MESSAGES, cut],
        continue_final_message=True,
        add_generation_prompt=False,
        max_tokens=6,
        temperature=0.0,
    )
    body = response.body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6
    counter = ChatTemplateCounter.from_pretrained(GGUF)
    assert body["usage"]["prompt_tokens"] == counter.count_prompt(MESSAGES)


def test_a_stream_is_sse_lines_with_usage_and_done(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    items = ask(
        loop,
        fallback,
        max_tokens=6,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    lines = [line for item in items for line in item]
    assert lines[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.strip()
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_a_prompt_over_the_window_is_a_400_not_a_crash(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    request = ChatRequest(
        model="cpu-fallback", messages=[{"role": "user", "content": "word " * 2000}], max_tokens=4
    )

    async def run() -> list[Any]:
        return [item async for item in fallback.chat(request)]

    [error] = loop.run_until_complete(run())
    assert isinstance(error, EngineError)
    assert (error.code, error.kind) == (400, "context_length_exceeded")
    assert ask(loop, fallback, max_tokens=2)  # and the replica still serves


async def busy_slots(engine: LlamaServerEngine) -> int:
    async with httpx.AsyncClient(base_url=engine.base_url) as client:
        slots = (await client.get("/slots", timeout=5)).json()
    return sum(bool(slot.get("is_processing")) for slot in slots)


def test_several_answers_are_decoded_at_once_and_a_client_that_leaves_frees_its_slot(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = new_engine()
    loop.run_until_complete(engine.start())
    long = ChatParams(messages=LONG_MESSAGES, max_tokens=400, temperature=0.0)

    async def scenario() -> tuple[int, int, list[Piece | Finish]]:
        streams = [engine.chat(long) for _ in range(PARALLEL)]
        await asyncio.gather(*(anext(stream) for stream in streams))  # every one has begun
        together = await busy_slots(engine)
        for stream in streams:
            await stream.aclose()  # every client went away
        for _ in range(50):
            if await busy_slots(engine) == 0:
                break
            await asyncio.sleep(0.1)
        after = await busy_slots(engine)
        short = [p async for p in engine.chat(ChatParams(messages=MESSAGES, max_tokens=2))]
        return together, after, short

    try:
        together, after, short = loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(engine.aclose())
    assert together == PARALLEL
    assert after == 0
    assert isinstance(short[-1], Finish)
    assert short[-1].completion_tokens == 2


def test_a_server_killed_mid_answer_is_restarted_and_the_answer_completed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = new_engine()
    loop.run_until_complete(engine.start())
    first_pid = engine.pid
    assert first_pid is not None
    params = ChatParams(messages=MESSAGES, max_tokens=24, temperature=0.0)

    async def answer(kill_after: int | None) -> list[Piece | Finish]:
        pieces: list[Piece | Finish] = []
        async for piece in engine.chat(params):
            pieces.append(piece)
            if len(pieces) == kill_after:
                os.kill(first_pid, signal.SIGKILL)
        return pieces

    try:
        whole = loop.run_until_complete(answer(kill_after=None))
        cut = loop.run_until_complete(answer(kill_after=3))
        health = loop.run_until_complete(engine.check_health())
    finally:
        loop.run_until_complete(engine.aclose())
    assert health is None
    assert engine.pid != first_pid
    assert (engine.restarts, engine.retried) == (1, 1)
    assert _text(cut) == _text(whole)
    assert cut[-1] == whole[-1]


def _text(pieces: list[Piece | Finish]) -> str:
    return "".join(p.text for p in pieces if isinstance(p, Piece))
