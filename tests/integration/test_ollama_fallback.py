"""The Ollama engine against a stand-in that follows Ollama's documented API
(tests/fakes/ollama_server.py, started as `ollama serve` by the engine's own supervisor), and
against the real binary wherever `ollama` is on PATH."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from autoscale.vram import fallback_engine_pids
from core.requests import ChatRequest
from core.types import FALLBACK_ENGINE_MARKER
from deployments.fallback.engine import ChatParams, EngineUnavailable, Finish, Piece
from deployments.fallback.ollama import OllamaApi, OllamaEngine
from deployments.fallback.replica import CpuFallback, FallbackSettings

FAKE_SERVER = Path(__file__).resolve().parents[1] / "fakes" / "ollama_server.py"
DEMO_GGUF = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
T = TypeVar("T")


@pytest.fixture
def fake_ollama(tmp_path: Path) -> str:
    """An executable `ollama` whose `serve` runs the stand-in."""
    binary = tmp_path / "bin" / "ollama"
    binary.parent.mkdir()
    binary.write_text(
        f"#!{sys.executable}\nimport runpy\n"
        f"runpy.run_path({str(FAKE_SERVER)!r}, run_name='__main__')\n"
    )
    binary.chmod(0o755)
    return str(binary)


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + os.urandom(3000))
    return path


def engine_for(binary: str, source: str, window: int = 2048, n_gpu_layers: int = 0) -> OllamaEngine:
    return OllamaEngine(
        binary=binary,
        source=source,
        model="gps-fallback",
        context_window=window,
        keep_alive="5m",
        n_gpu_layers=n_gpu_layers,
        sleep=lambda _: asyncio.sleep(0),  # restart at once in tests
    )


def run_with(engine: OllamaEngine, work: Callable[[], Awaitable[T]]) -> T:
    async def scenario() -> T:
        await engine.start()
        try:
            return await work()
        finally:
            await engine.aclose()

    return asyncio.run(scenario())


async def asked(engine: OllamaEngine) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=engine.base_url) as client:
        reply: dict[str, Any] = (await client.get("/_fake/asked")).json()
        return reply


async def collect(engine: OllamaEngine, params: ChatParams) -> list[Piece | Finish]:
    return [piece async for piece in engine.chat(params)]


def test_a_gguf_becomes_a_model_whose_window_is_the_configured_one(
    fake_ollama: str, gguf: Path
) -> None:
    engine = engine_for(fake_ollama, str(gguf), window=3072)
    seen = run_with(engine, lambda: asked(engine))
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert seen["blob_uploads"] == [{"digest": digest, "size": gguf.stat().st_size}]
    assert seen["create"] == [
        {
            "model": "gps-fallback",
            "files": {"tiny.gguf": digest},
            "parameters": {"num_ctx": 3072},
            "stream": False,
        }
    ]


def test_ollama_sees_no_gpu_at_zero_layers_and_is_asked_for_a_count_otherwise(
    fake_ollama: str, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as on a GPU node: the replica sees one

    async def env_and_asked(
        engine: OllamaEngine,
    ) -> tuple[dict[str, Any], dict[str, Any], bool]:
        async with httpx.AsyncClient(base_url=engine.base_url) as client:
            env = (await client.get("/_fake/env")).json()
        # What the node's VRAM probe finds in /proc: the engine is the fallback's, or not.
        return env, await asked(engine), engine.pid in fallback_engine_pids()

    cpu = engine_for(fake_ollama, str(gguf))
    env, seen, marked = run_with(cpu, lambda: env_and_asked(cpu))
    assert env == {
        "CUDA_VISIBLE_DEVICES": "-1",
        "HIP_VISIBLE_DEVICES": "-1",
        FALLBACK_ENGINE_MARKER: None,
    }
    assert seen["create"][-1]["parameters"] == {"num_ctx": 2048}
    assert not marked  # no GPU, no share of one to keep
    offloaded = engine_for(fake_ollama, str(gguf), n_gpu_layers=20)
    env, seen, marked = run_with(offloaded, lambda: env_and_asked(offloaded))
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0",
        "HIP_VISIBLE_DEVICES": None,
        FALLBACK_ENGINE_MARKER: "1",
    }
    assert seen["create"][-1]["parameters"] == {"num_ctx": 2048, "num_gpu": 20}
    assert marked


def test_a_blob_ollama_already_has_is_not_uploaded_again(fake_ollama: str, gguf: Path) -> None:
    engine = engine_for(fake_ollama, str(gguf))

    async def push_again() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=engine.base_url) as client:
            await OllamaApi(client).push_blob(gguf)
        return await asked(engine)

    assert len(run_with(engine, push_again)["blob_uploads"]) == 1


def test_chat_streams_pieces_and_sends_window_limit_and_keep_alive(
    fake_ollama: str, gguf: Path
) -> None:
    engine = engine_for(fake_ollama, str(gguf))
    params = ChatParams(
        messages=[{"role": "user", "content": "one two three four"}],
        max_tokens=3,
        temperature=0.2,
        stop=["x"],
        seed=1,
    )

    async def chat() -> tuple[list[Piece | Finish], dict[str, Any]]:
        return await collect(engine, params), await asked(engine)

    pieces, seen = run_with(engine, chat)
    assert pieces[:-1] == [Piece("Echo:"), Piece(" one"), Piece(" two")]
    assert pieces[-1] == Finish("length", prompt_tokens=8, completion_tokens=3)
    [body] = seen["chat"]
    assert body["model"] == "gps-fallback"
    assert (body["stream"], body["keep_alive"]) == (True, "5m")
    assert body["options"] == {
        "num_ctx": 2048,
        "num_predict": 3,
        "temperature": 0.2,
        "stop": ["x"],
        "seed": 1,
    }


def test_a_model_named_instead_of_a_file_is_pulled(fake_ollama: str) -> None:
    # Pulled, it is not created by us: its GPU layers go in every request's options instead.
    engine = engine_for(fake_ollama, "llama3.2:1b", n_gpu_layers=12)
    params = ChatParams(messages=[{"role": "user", "content": "hi"}], max_tokens=5)

    async def chat() -> tuple[list[Piece | Finish], dict[str, Any]]:
        return await collect(engine, params), await asked(engine)

    pieces, seen = run_with(engine, chat)
    assert seen["pull"] == [{"model": "llama3.2:1b", "stream": False}]
    assert seen["create"] == []
    assert seen["chat"][0]["model"] == "llama3.2:1b"
    assert seen["chat"][0]["options"] == {"num_ctx": 2048, "num_gpu": 12, "num_predict": 5}
    assert pieces[-1] == Finish("stop", prompt_tokens=5, completion_tokens=2)


def test_a_server_that_dies_is_restarted_and_serves_again(fake_ollama: str, gguf: Path) -> None:
    engine = engine_for(fake_ollama, str(gguf))
    params = ChatParams(messages=[{"role": "user", "content": "still here"}], max_tokens=8)

    async def kill_and_chat() -> list[Piece | Finish]:
        first_pid = engine.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        for _ in range(300):
            if engine.restarts == 1:
                break
            await asyncio.sleep(0.05)
        assert engine.restarts == 1
        assert engine.pid != first_pid
        await engine.check_health()
        return await collect(engine, params)

    pieces = run_with(engine, kill_and_chat)
    assert "".join(p.text for p in pieces if isinstance(p, Piece)) == "Echo: still here"


def test_an_error_line_mid_stream_is_an_engine_fault(fake_ollama: str, gguf: Path) -> None:
    engine = engine_for(fake_ollama, str(gguf))
    params = ChatParams(messages=[{"role": "user", "content": "a b c"}], max_tokens=8)

    async def fail_mid_stream() -> list[Piece | Finish]:
        async with httpx.AsyncClient(base_url=engine.base_url) as client:
            await client.post("/_fake/fail", json={"mode": "error_line"})
        got: list[Piece | Finish] = []
        with pytest.raises(EngineUnavailable, match="injected failure"):  # noqa: PT012 - mid-stream
            async for piece in engine.chat(params):
                got.append(piece)
        return got

    assert run_with(engine, fail_mid_stream) == [Piece("Echo:")]


def test_auto_picks_ollama_where_the_binary_is_on_path(
    fake_ollama: str, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(fake_ollama).parent}{os.pathsep}{os.environ['PATH']}")
    settings = FallbackSettings(
        engine="auto",
        source=str(gguf),
        model_id="cpu-fallback",
        context_window=2048,
        threads=1,
        ollama_model="gps-fallback",
        keep_alive="5m",
    )
    request = ChatRequest(
        model="cpu-fallback", messages=[{"role": "user", "content": "hello there"}]
    )

    async def scenario() -> tuple[str, Any]:
        replica = CpuFallback.__new__(CpuFallback)
        await CpuFallback.__init__(replica, settings)  # Serve awaits its async __init__
        try:
            return await replica.engine(), [item async for item in replica.chat(request)]
        finally:
            await replica.aclose()

    engine, [response] = asyncio.run(scenario())
    assert engine == "ollama"
    assert response.body["choices"][0]["message"]["content"] == "Echo: hello there"


@pytest.mark.skipif(shutil.which("ollama") is None, reason="no `ollama` binary on PATH")
def test_the_real_ollama_binary_serves_the_demo_gguf() -> None:
    binary = shutil.which("ollama")
    assert binary is not None
    engine = engine_for(binary, str(DEMO_GGUF))
    params = ChatParams(messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
    pieces = run_with(engine, lambda: collect(engine, params))
    assert isinstance(pieces[-1], Finish)
    assert pieces[-1].completion_tokens <= 8
    assert "".join(p.text for p in pieces if isinstance(p, Piece)).strip()
