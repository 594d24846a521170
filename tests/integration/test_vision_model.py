"""The demo vision model that `make model` builds (cluster/vision_model.py): a real Idefics3 whose
processor transformers reads without torchvision, and whose GGUF and projector llama.cpp's
`llama-server --mmproj` reads and counts as transformers does, its greedy answers depending on
the image. vLLM serving it, answers and all, is tested end to end (tests/e2e/test_images.py); a
transformers `generate` here cost over a minute of no-ray's time on a loaded 2-core machine for
nothing those two do not show."""

from __future__ import annotations

import base64
import io
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from cluster.vision_model import VISION_GGUF, VISION_MMPROJ, VISION_NAME, VisionShape

MODELS = Path(__file__).parents[2] / ".models"
VISION = MODELS / VISION_NAME
ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]


@pytest.fixture(scope="module")
def processor() -> Any:
    if not (VISION / "model.safetensors").is_file():
        pytest.fail(f"{VISION} is missing: run `make model` (make test does it)")
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(VISION)


def tokens_for(processor: Any, image: Image.Image) -> list[int]:
    text = processor.apply_chat_template(ASK, add_generation_prompt=True)
    ids: list[int] = processor(text=text, images=[image])["input_ids"][0]
    return ids


def test_the_processor_needs_no_torchvision() -> None:
    # The Makefile uninstalls torchvision (it breaks CPU torch): the PIL image processor it is.
    script = (
        "import sys; from transformers import AutoProcessor; "
        f"p = AutoProcessor.from_pretrained({str(VISION)!r}); "
        "print(type(p.image_processor).__name__, 'torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["Idefics3ImageProcessorPil", "False"]


def test_an_image_costs_its_tiles_in_tokens(processor: Any) -> None:
    shape = VisionShape()
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    square = tokens_for(processor, Image.new("RGB", (64, 64), "red"))
    wide = tokens_for(processor, Image.new("RGB", (300, 60), "blue"))
    # A square fills 2 x 2 tiles and the whole image; a wide strip 1 x 2 and the whole image.
    assert square.count(image_token) == 5 * shape.tokens_per_tile == 320
    assert wide.count(image_token) == 3 * shape.tokens_per_tile
    text_only = processor.apply_chat_template(
        [{"role": "user", "content": "What is this?"}], add_generation_prompt=True
    )
    assert len(square) > len(processor(text=text_only)["input_ids"][0]) + 320


def test_the_ggufs_are_a_llama_model_and_an_idefics3_projector() -> None:
    from gguf import GGUFReader

    def field(reader: GGUFReader, key: str) -> str:
        value = reader.get_field(key)
        assert value is not None, key
        return str(value.contents())

    text = GGUFReader(MODELS / VISION_GGUF)
    assert field(text, "general.architecture") == "llama"
    projector = GGUFReader(MODELS / VISION_MMPROJ)
    assert field(projector, "clip.projector_type") == "idefics3"


def data_url(image: Image.Image) -> str:
    png = io.BytesIO()
    image.save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def test_llama_server_reads_the_projector_and_counts_as_the_processor(processor: Any) -> None:
    from deployments.fallback.replica import llama_server_binary

    binary = llama_server_binary()
    if binary is None:
        pytest.fail("no llama-server beside this Python: run `make install` (make test does it)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [binary, "-m", str(MODELS / VISION_GGUF), "--mmproj", str(MODELS / VISION_MMPROJ)]
    command += ["--port", str(port), "-c", "2048", "-t", "1", "--jinja", "--no-cache-prompt"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        for _ in range(600):
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, "llama-server exited"
            time.sleep(0.1)

        def ask(image: Image.Image) -> tuple[int, str]:
            parts = [{"type": "image_url", "image_url": {"url": data_url(image)}}]
            parts.append({"type": "text", "text": "What is this?"})
            body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 8}
            answer = client.post("/v1/chat/completions", json=body | {"temperature": 0}).json()
            return answer["usage"]["prompt_tokens"], answer["choices"][0]["message"]["content"]

        red = Image.new("RGB", (64, 64), "red")
        noise = np.random.default_rng(1).integers(0, 255, (64, 48, 3), dtype=np.uint8)
        counted, said = ask(red)
        # The same template in the GGUF: the same prompt, image tokens and all.
        assert counted == len(tokens_for(processor, red))
        assert ask(Image.fromarray(noise))[1] != said
        assert ask(red) == (counted, said)
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=30)


def test_the_cpu_fallback_reads_images_with_the_projector_and_counts_them_as_the_processor(
    processor: Any,
) -> None:
    """fallback.mmproj: the CpuFallback replica on llama-server, without Serve. Its count of
    an image of a size is the processor's, and a chat with one is read (the answer depends on
    it) and counted by llama-server."""
    import asyncio

    from core.answers import WholeAnswer
    from core.requests import ChatRequest
    from deployments.fallback.replica import CpuFallback, FallbackSettings

    settings = FallbackSettings(
        engine="auto",
        source=str(MODELS / VISION_GGUF),
        mmproj=str(MODELS / VISION_MMPROJ),
        model_id="cpu-fallback",
        context_window=1024,
        threads=1,
        ollama_model="unused",
        keep_alive="1m",
        parallel=1,
    )

    async def scenario() -> tuple[list[int] | None, list[tuple[int, str]]]:
        replica = CpuFallback.__new__(CpuFallback)
        await CpuFallback.__init__(replica, settings)  # Serve awaits it
        try:
            counts = await replica.image_tokens([(64, 64), (300, 60)])
            answers = []
            for image in (red, noise, red):
                parts = [{"type": "image_url", "image_url": {"url": data_url(image)}}]
                parts.append({"type": "text", "text": "What is this?"})
                request = ChatRequest(
                    model="cpu-fallback",
                    messages=[{"role": "user", "content": parts}],
                    max_tokens=8,
                    temperature=0,
                )
                [whole] = [item async for item in replica.chat(request)]
                assert isinstance(whole, WholeAnswer), whole
                body = whole.body
                answer = (body["usage"]["prompt_tokens"], body["choices"][0]["message"]["content"])
                answers.append(answer)
            return counts, answers
        finally:
            await replica.aclose()

    red = Image.new("RGB", (64, 64), "red")
    noise = Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 48, 3), dtype=np.uint8))
    counts, answers = asyncio.run(scenario())
    text_only = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True,
    )
    plain = len(processor(text=text_only)["input_ids"][0])
    wide = Image.new("RGB", (300, 60), "blue")
    assert counts == [
        len(tokens_for(processor, red)) - plain,
        len(tokens_for(processor, wide)) - plain,
    ]
    (counted, said), (_, other), again = answers
    assert counted == len(tokens_for(processor, red))  # llama-server's count of the prompt
    assert other != said
    assert again == (counted, said)
