"""The CPU fallback on the real llama.cpp engine (its server a supervised child process) and the
demo model's GGUF, without Serve: answers, counts, a killed engine, a killed replica."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.answers import EngineError
from core.requests import ChatRequest
from deployments.fallback.engine import ChatParams, Finish, Piece
from deployments.fallback.llama_cpp_python_engine import LlamaCppEngine
from deployments.fallback.replica import CpuFallback, FallbackSettings
from policy.context.tokens import ChatTemplateCounter

GGUF = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WINDOW = 512
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Count from one to fifty, in words."},
]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run `make model` (make test does it)")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is part of the cpu extra")
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module")
def fallback(loop: asyncio.AbstractEventLoop) -> Iterator[CpuFallback]:
    settings = FallbackSettings(
        engine="llama_cpp",
        source=str(GGUF),
        model_id="cpu-fallback",
        context_window=WINDOW,
        threads=1,
        ollama_model="unused",
        keep_alive="1m",
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


def test_a_whole_answer_has_text_and_the_exact_prompt_count(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    [response] = ask(loop, fallback, max_tokens=8, temperature=0.0)
    body = response.body
    assert body["model"] == "cpu-fallback"
    assert body["choices"][0]["message"]["content"].strip()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8
    # The router counts with the GGUF's own tokenizer and template: the same number.
    counter = ChatTemplateCounter.from_pretrained(GGUF)
    assert body["usage"]["prompt_tokens"] == counter.count_prompt(MESSAGES)


def test_a_cut_answer_is_continued_and_only_new_tokens_count(
    loop: asyncio.AbstractEventLoop, fallback: CpuFallback
) -> None:
    """What mid-stream failover sends the fallback (vLLM's continue_final_message)."""
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
    assert body["usage"]["completion_tokens"] == 6  # the cut text was the client's already
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
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


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


def test_a_client_that_leaves_stops_its_generation(loop: asyncio.AbstractEventLoop) -> None:
    engine = LlamaCppEngine(model_path=str(GGUF), context_window=WINDOW, threads=1)
    loop.run_until_complete(engine.start())

    async def leave_then_ask() -> tuple[list[Piece | Finish], dict[str, Any]]:
        stream = engine.chat(ChatParams(messages=MESSAGES, max_tokens=400))
        await anext(stream)
        await stream.aclose()  # the client went away after one piece
        pieces = [p async for p in engine.chat(ChatParams(messages=MESSAGES, max_tokens=2))]
        return pieces, await engine.stats()

    try:
        pieces, stats = loop.run_until_complete(leave_then_ask())
    finally:
        loop.run_until_complete(engine.aclose())
    assert isinstance(pieces[-1], Finish)
    assert pieces[-1].completion_tokens == 2
    # One worker runs requests in order: the second ran after the first had stopped early.
    assert stats["cancelled"] == 1
    # At 0 GPU layers (the default) the server was started with no GPU to see.
    assert stats["cuda_visible_devices"] == ""


def test_an_engine_killed_mid_answer_is_restarted_and_the_answer_completed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = LlamaCppEngine(
        model_path=str(GGUF), context_window=WINDOW, threads=1, sleep=lambda _: asyncio.sleep(0)
    )
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
    assert health is None  # healthy again, on a new process
    assert engine.pid != first_pid
    assert engine.restarts == 1
    assert engine.retried == 1
    # One answer, as if nothing happened: the restarted engine went on from the text already
    # sent (greedy decoding gives the same words), and the count covers the whole of it.
    assert len(whole) > 4
    assert isinstance(whole[-1], Finish)
    assert _text(cut) == _text(whole)
    assert cut[-1] == whole[-1]


def _text(pieces: list[Piece | Finish]) -> str:
    return "".join(p.text for p in pieces if isinstance(p, Piece))


REPLICA_SCRIPT = """
import asyncio, sys
from deployments.fallback.llama_cpp_python_engine import LlamaCppEngine

async def main():
    engine = LlamaCppEngine(model_path=sys.argv[1], context_window=256, threads=1)
    await engine.start()
    print(engine.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_an_engine_dies_with_its_replica_killed_by_sigkill() -> None:
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run `make model` (make test does it)")
    with subprocess.Popen(  # the `with` kills nothing, but closes the pipe and reaps
        [sys.executable, "-c", REPLICA_SCRIPT, str(GGUF)], stdout=subprocess.PIPE, text=True
    ) as replica:
        try:
            assert replica.stdout is not None
            engine_pid = int(replica.stdout.readline())
            assert process_alive(engine_pid)
            replica.kill()  # SIGKILL: no code of the replica runs
            replica.wait()
            deadline = time.monotonic() + 30
            while process_alive(engine_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not process_alive(engine_pid), f"engine {engine_pid} outlived its replica"
        finally:
            replica.kill()


def process_alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
