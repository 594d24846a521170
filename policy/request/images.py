"""The images a chat carries, checked at the edge against `gateway.media`.

Each image's format and size come from its own header first (Pillow opens it lazily), so a
decompression bomb or a format the operator did not take is the client's 400 naming the part
before a pixel is decoded; then, within those limits, its pixels are decoded once, so a damaged
or truncated file is refused here too, never an engine's error that could count against a link.
`check_image_url` (messages.py) has already made each one a base64 data URL.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any, NoReturn

from core.config import MediaConfig
from core.errors import ApiError, ErrorCode
from policy.request.fields import fail
from policy.request.messages import image_parts

__all__ = ["check_image_count", "check_images"]

# Pillow's names for kinds of a format: a phone camera's JPEG with an MPO extension is a JPEG.
_SAME_AS = {"mpo": "jpeg"}


def check_images(messages: Any, media: MediaConfig) -> None:
    places = [
        (f"{where}.image_url.url", part["image_url"]["url"])
        for where, part in image_parts(messages)
    ]
    check_image_count(len(places), media)
    for where, url in places:
        _check_image(url, where, media)


def check_image_count(count: int, media: MediaConfig, param: str = "messages") -> None:
    """At most `max_images_per_request` images a request, or the client's 400 naming it."""
    if count > media.max_images_per_request:
        raise ApiError(
            400,
            ErrorCode.INVALID_REQUEST,
            f"The request carries {count} images; this gateway takes at most "
            f"{media.max_images_per_request} per request (gateway.media.max_images_per_request).",
            param=param,
        )


def _check_image(url: str, where: str, media: MediaConfig) -> None:
    data = url.partition(",")[2]
    # Base64 holds 3 bytes in 4 characters: too long encoded is too large decoded.
    if len(data) // 4 * 3 > media.max_image_bytes + 2:
        _too_large(where, media)
    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error:
        fail(where, "holds data that is not valid base64")
    if len(raw) > media.max_image_bytes:
        _too_large(where, media)
    from PIL import Image  # only where a request carries an image

    try:
        with warnings.catch_warnings():
            # Pillow warns past its own bomb limit and raises past twice it: our limit decides.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as image:
                kind = (image.format or "").lower()
                kind = _SAME_AS.get(kind, kind)
                _check_header(kind, image.size, where, media)
                if kind == "jpeg":  # decoded at an eighth of its size: all its data still read
                    image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
                # The pixels, once, within the limits just checked: bytes an engine could not
                # decode (a truncated file) are the client's 400 here, not an engine's error.
                image.load()
    except ApiError:
        raise
    except Image.DecompressionBombError:  # past twice Pillow's own limit: far past ours
        fail(
            where, f"has more than {media.max_image_pixels} pixels (gateway.media.max_image_pixels)"
        )
    except Exception:  # noqa: BLE001 - any parser's error on hostile bytes is the client's
        fail(
            where,
            f"is not an image this gateway reads ({', '.join(media.image_formats)}), or it is "
            "damaged or truncated",
        )


def _check_header(kind: str, size: tuple[int, int], where: str, media: MediaConfig) -> None:
    if kind not in media.image_formats:
        fail(
            where,
            f"is a {kind.upper()} image; this gateway takes {', '.join(media.image_formats)} "
            "(gateway.media.image_formats)",
        )
    width, height = size
    if width * height > media.max_image_pixels:
        fail(
            where,
            f"is {width} x {height} pixels; this gateway takes at most "
            f"{media.max_image_pixels} pixels an image (gateway.media.max_image_pixels)",
        )


def _too_large(where: str, media: MediaConfig) -> NoReturn:
    fail(
        where,
        f"is larger than {media.max_image_bytes} bytes, the most an image may be "
        "(gateway.media.max_image_bytes)",
    )
