"""`gateway.media` at the edge: how many images, how large, how many pixels, which formats, each
a 400 that names the part and the limit, read from the image's own header."""

from __future__ import annotations

import base64
import io
import random
import zlib
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from cluster.backends import NO_MEDIA_DOMAIN, llm_config_for
from core.config import ConfigError, GatewayConfig, MediaConfig, parse_config
from core.errors import ApiError
from core.topology import Backend
from deployments.ingress.jobs import validate_chat


def data_url(image: Image.Image, kind: str = "PNG", claimed: str = "png") -> str:
    encoded = io.BytesIO()
    image.save(encoded, kind)
    return f"data:image/{claimed};base64," + base64.b64encode(encoded.getvalue()).decode()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data).to_bytes(4, "big")
    return len(data).to_bytes(4, "big") + kind + data + crc


def png_header_only(width: int, height: int) -> str:
    """A PNG that claims `width` x `height` in its header (what a decompression bomb shows)."""
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    raw = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header)
    raw += png_chunk(b"IDAT", zlib.compress(b"\0" * 16)) + png_chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(raw).decode()


RED = data_url(Image.new("RGB", (64, 32), "red"))


def chat(*urls: str, **media: Any) -> None:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    body = {"model": "vision", "messages": [{"role": "user", "content": parts}]}
    validate_chat(body, GatewayConfig(media=MediaConfig(**media)))


def refusal(*urls: str, **media: Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        chat(*urls, **media)
    assert refused.value.status == 400
    return refused.value


def test_images_within_the_limits_pass() -> None:
    chat(RED, data_url(Image.new("RGB", (8, 8)), "JPEG", "jpeg"), max_images_per_request=2)
    chat(data_url(Image.new("RGB", (8, 8)), "WEBP", "webp"))
    # A phone camera's JPEG with a second picture (MPO, to Pillow) is a JPEG.
    mpo = io.BytesIO()
    Image.new("RGB", (8, 8)).save(
        mpo, "MPO", save_all=True, append_images=[Image.new("RGB", (8, 8))]
    )
    chat("data:image/jpeg;base64," + base64.b64encode(mpo.getvalue()).decode())


def test_more_images_than_a_request_may_carry_is_a_400_naming_the_limit() -> None:
    error = refusal(RED, RED, RED, max_images_per_request=2)
    assert error.param == "messages"
    assert "3 images" in error.message
    assert "gateway.media.max_images_per_request" in error.message
    assert "at most 0" in refusal(RED, max_images_per_request=0).message


def test_an_image_past_the_byte_limit_is_refused_before_it_is_decoded() -> None:
    noise = Image.frombytes("RGB", (128, 128), random.Random(0).randbytes(128 * 128 * 3))
    error = refusal(data_url(noise), max_image_bytes=1024)
    assert error.param == "messages[0].content[0].image_url.url"
    assert "1024 bytes" in error.message


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    # 9000 x 9000 claimed in 70 bytes: refused on the header, never decoded here or anywhere.
    bomb = png_header_only(9000, 9000)
    assert "9000 x 9000" in refusal(bomb).message
    # Past twice Pillow's own limit Pillow refuses to open it at all: still our 400.
    assert "max_image_pixels" in refusal(png_header_only(30_000, 30_000)).message
    assert "max_image_pixels" in refusal(RED, max_image_pixels=64 * 31).message


def test_a_format_not_taken_is_a_400_by_what_the_bytes_are_not_what_the_url_claims() -> None:
    gif_as_png = data_url(Image.new("P", (4, 4)), "GIF", claimed="png")
    error = refusal(gif_as_png, image_formats=("png", "jpeg"))
    assert "is a GIF image" in error.message
    assert "gateway.media.image_formats" in error.message


def encoded(image: Image.Image, kind: str) -> bytes:
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


NOISE = Image.frombytes("RGB", (64, 64), random.Random(1).randbytes(64 * 64 * 3))


@pytest.mark.parametrize(
    "data",
    [
        b"not an image at all",
        b"\x89PNG\r\n\x1a\n",
        b"GIF89a",
        encoded(NOISE, "PNG")[:-600],  # a valid header, its pixels cut short
        encoded(NOISE, "JPEG")[:-600],
    ],
    ids=[
        "text",
        "a PNG signature alone",
        "a GIF signature alone",
        "truncated PNG",
        "truncated JPEG",
    ],
)
def test_bytes_that_are_not_a_whole_image_are_a_400(data: bytes) -> None:
    # Refused here: an engine that failed to decode them might count it against its link.
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    message = refusal(url).message
    assert "is not an image this gateway reads" in message
    assert "damaged or truncated" in message


def vision_config(tmp_path: Path, engine_kwargs: dict[str, Any], images: int = 8) -> Any:
    raw = {
        "pools": [{"name": "local", "kind": "local"}],
        "models": [
            {"role": "vision", "source": str(tmp_path), "context_window": 4096,
             "pools": ["local"], "images": True, "engine_kwargs": engine_kwargs},
            {"role": "coding", "source": str(tmp_path), "context_window": 4096,
             "pools": ["local"], "images": False},
        ],
        "fallback": {"source": "fallback.gguf", "context_window": 2048},
        "gateway": {"media": {"max_images_per_request": images}},
    }  # fmt: skip
    return parse_config(raw, base_dir=tmp_path, environ={})


def test_image_reading_engines_take_the_gateways_limit_and_never_fewer(tmp_path: Path) -> None:
    config = vision_config(tmp_path, {}, images=3)
    kwargs = llm_config_for(config, Backend(model="vision", pool="local")).engine_kwargs
    assert kwargs["limit_mm_per_prompt"] == {"image": 3}
    text = llm_config_for(config, Backend(model="coding", pool="local")).engine_kwargs
    assert "limit_mm_per_prompt" not in text
    backend = Backend(model="vision", pool="local")
    more = vision_config(tmp_path, {"limit_mm_per_prompt": {"image": 5}}, images=3)
    assert llm_config_for(more, backend).engine_kwargs["limit_mm_per_prompt"] == {"image": 5}
    # Limits of other media keep the gateway's image count beside them.
    video = vision_config(tmp_path, {"limit_mm_per_prompt": {"video": 1}}, images=3)
    limits = llm_config_for(video, backend).engine_kwargs["limit_mm_per_prompt"]
    assert limits == {"image": 3, "video": 1}
    for fewer in (2, {"count": 2}):
        with pytest.raises(ConfigError, match=r"limit_mm_per_prompt.image: 2 is fewer than"):
            vision_config(tmp_path, {"limit_mm_per_prompt": {"image": fewer}}, images=3)


def test_engines_fetch_no_media_and_may_not_be_told_to(tmp_path: Path) -> None:
    config = vision_config(tmp_path, {}, images=3)
    for model in ("vision", "coding"):  # a text model's engine may read audio or video URLs
        kwargs = llm_config_for(config, Backend(model=model, pool="local")).engine_kwargs
        assert kwargs["allowed_media_domains"] == [NO_MEDIA_DOMAIN]
    assert NO_MEDIA_DOMAIN.endswith(".invalid")  # a name that never resolves
    # And the edge sends none: audio and video by URL are refused as images are.
    for kind in ("audio_url", "video_url"):
        part = {"type": kind, kind: {"url": "http://10.0.0.1/a"}}
        body = {"model": "vision", "messages": [{"role": "user", "content": [part]}]}
        with pytest.raises(ApiError, match="must be a data URL") as refused:
            validate_chat(body, GatewayConfig())
        assert refused.value.param == f"messages[0].content[0].{kind}.url"
    for key in ("allowed_media_domains", "allowed_local_media_path"):
        with pytest.raises(ConfigError, match=f"engine_kwargs.{key}: the gateway fetches"):
            vision_config(tmp_path, {key: ["example.com"]}, images=3)
