"""The `messages` of a chat request: roles, content and its parts, tool calls.

Our own code reads them raw (routing by image parts, the depth router, context fitting count the
text parts), and vLLM validates a message's parts lazily, outside pydantic, so a part of the
wrong shape must be refused here. Each role may send the part types OpenAI allows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from core.errors import ApiError, ErrorCode
from policy.request.fields import check_optional, fail, fail_choice, json_kind, require

__all__ = [
    "ASSISTANT_WITHOUT_CONTENT",
    "AUDIO_FORMATS",
    "IMAGE_DETAILS",
    "PART_TYPES",
    "ROLES",
    "carries_images",
    "check_image_url",
    "check_messages",
    "image_parts",
]

ROLES = ("system", "developer", "user", "assistant", "tool")
# audio_url and video_url are vLLM's. `file` is OpenAI's, but no backend here reads it: vLLM has
# no parser for it, and the CPU fallback would drop it without a word.
PART_TYPES = {
    "system": ("text",),
    "developer": ("text",),
    "tool": ("text",),
    "assistant": ("text", "refusal"),
    "user": ("text", "image_url", "input_audio", "audio_url", "video_url"),
}
IMAGE_DETAILS = ("auto", "low", "high")
AUDIO_FORMATS = ("wav", "mp3")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
# An assistant turn with one of these may leave `content` out (OpenAI's rule; its deprecated
# `function_call` is not taken).
ASSISTANT_WITHOUT_CONTENT = ("tool_calls", "refusal")


def image_parts(messages: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each image part of the messages, with where it is (`messages[i].content[j]`)."""
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            for j, part in enumerate(message["content"]):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    yield f"messages[{i}].content[{j}]", part


def carries_images(messages: Any) -> bool:
    """Whether any message holds an image part (only a model that reads images may take it)."""
    return next(image_parts(messages), None) is not None


def check_messages(messages: Any, limit: int) -> None:
    if not isinstance(messages, list):
        fail("messages", f"must be an array of messages, not {json_kind(messages)}")
    if not messages:
        fail("messages", "must not be empty")
    if len(messages) > limit:
        raise ApiError(
            400,
            ErrorCode.TOO_MANY_MESSAGES,
            f"messages holds {len(messages)} messages; this gateway takes at most {limit}.",
            param="messages",
        )
    for index, message in enumerate(messages):
        _check_message(message, f"messages[{index}]")


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        fail(where, f"must be an object, not {json_kind(message)}")
    role = message.get("role")
    if role not in ROLES:
        fail_choice(f"{where}.role", role, ROLES)
    check_optional(message, "name", str, "a string", where)
    if role == "tool":
        require(message, "tool_call_id", str, "a string", where)
    if role == "assistant":
        _check_tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        check_optional(message, "refusal", str, "a string", where)
    content = message.get("content")
    if content is None:
        if role == "assistant" and any(message.get(k) for k in ASSISTANT_WITHOUT_CONTENT):
            return
        fail(
            f"{where}.content", "is required" + (" (or tool_calls)" if role == "assistant" else "")
        )
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        fail(f"{where}.content", f"must be a string or an array of parts, not {json_kind(content)}")
    for index, part in enumerate(content):
        _check_part(part, PART_TYPES[role], f"{where}.content[{index}]", role)


def _check_part(part: Any, allowed: tuple[str, ...], where: str, role: str) -> None:
    if not isinstance(part, dict):
        fail(where, f"must be an object with a `type`, not {json_kind(part)}")
    kind = part.get("type")
    if kind not in allowed:
        fail_choice(f"{where}.type", kind, allowed, f" in {role} messages")
    _PART_CHECKS[kind](part, where)


def _text_part(part: dict[str, Any], where: str) -> None:
    require(part, "text", str, "a string", where)


def _refusal_part(part: dict[str, Any], where: str) -> None:
    require(part, "refusal", str, "a string", where)


def _image_part(part: dict[str, Any], where: str) -> None:
    image = require(part, "image_url", dict, "an object with a url", where)
    url = require(image, "url", str, "a string", f"{where}.image_url")
    if image.get("detail") not in (None, *IMAGE_DETAILS):
        fail(f"{where}.image_url.detail", f"must be one of {', '.join(IMAGE_DETAILS)}")
    check_image_url(url, f"{where}.image_url.url")


def check_image_url(url: str, where: str) -> None:
    """Images come inline. Any other URL would have the engine fetch it from wherever it runs:
    a door into the operator's network that no setting of ours opens."""
    head, comma, data = url.partition(",")
    if not head.lower().startswith("data:"):
        fail(
            where,
            "must be a data URL (data:image/png;base64,...): this gateway fetches images "
            "from the network only from hosts its operator lists in "
            "gateway.media.allowed_domains, and not here; send the image's bytes inline",
        )
    kind = head.lower()
    if not comma or not kind.startswith("data:image/") or not kind.endswith(";base64"):
        fail(where, "must be an image's data URL in base64: data:image/<format>;base64,<data>")
    # The alphabet only: check_images decodes it once, within gateway.media's size.
    if len(data) % 4 or not _BASE64.fullmatch(data):
        fail(where, "holds data that is not valid base64")


def _audio_part(part: dict[str, Any], where: str) -> None:
    audio = require(part, "input_audio", dict, "an object with data and format", where)
    require(audio, "data", str, "a base64 string", f"{where}.input_audio")
    if audio.get("format") not in AUDIO_FORMATS:
        fail(f"{where}.input_audio.format", f"must be one of {', '.join(AUDIO_FORMATS)}")


def _url_part(field: str) -> Callable[[dict[str, Any], str], None]:
    def check(part: dict[str, Any], where: str) -> None:
        media = require(part, field, dict, "an object with a url", where)
        url = require(media, "url", str, "a string", f"{where}.{field}")
        if url[:5].lower() != "data:":  # an engine told to fetch it would, from its node
            fail(
                f"{where}.{field}.url",
                "must be a data URL: this gateway fetches no audio or video from the network; "
                "send the bytes inline",
            )

    return check


_PART_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "text": _text_part,
    "refusal": _refusal_part,
    "image_url": _image_part,
    "input_audio": _audio_part,
    "audio_url": _url_part("audio_url"),
    "video_url": _url_part("video_url"),
}


def _check_tool_calls(calls: Any, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        fail(where, f"must be an array, not {json_kind(calls)}")
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict):
            fail(at, f"must be an object, not {json_kind(call)}")
        require(call, "id", str, "a string", at)
        if call.get("type", "function") != "function":
            fail(f"{at}.type", "must be function")
        function = require(call, "function", dict, "an object", at)
        require(function, "name", str, "a string", f"{at}.function")
        require(function, "arguments", str, "a string of JSON", f"{at}.function")
