"""The whole `/v1/embeddings` request body, checked before vLLM's schema sees it (as `schema.py`
does for chats): every mistake a 400 naming the field.

`input` is a text, a list of texts, token ids, or a list of token-id lists, as OpenAI takes it
(at most `MAX_INPUTS`, none empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy.request.fields import check_optional, fail, is_int, json_kind

__all__ = [
    "EMBEDDING_FIELDS",
    "ENCODING_FORMATS",
    "MAX_INPUTS",
    "check_embedding_request",
    "embedding_inputs",
]

MAX_INPUTS = 2048  # OpenAI's limit per request
ENCODING_FORMATS = ("float", "base64")
MAX_TOKEN_ID = 2**31 - 1


# OpenAI's fields, and vLLM's that change only how inputs are read and vectors written. Any
# other is refused: a generation field (`stream`, `max_tokens`, `tools`, ...) would otherwise
# ride along as an attribute of vLLM's request and be read as if this were a chat.
EMBEDDING_FIELDS = frozenset(
    {
        "model",
        "input",
        "dimensions",
        "encoding_format",
        "user",
        "truncate_prompt_tokens",
        "truncation_side",
        "add_special_tokens",
        "use_activation",
        "embed_dtype",
        "endianness",
    }
)


def check_embedding_request(payload: Mapping[str, Any]) -> None:
    """Raise ApiError 400 for the first field an embeddings request gets wrong."""
    for other, endpoint in (("messages", "/v1/chat/completions"), ("prompt", "/v1/completions")):
        if other in payload:  # a body meant for another endpoint: never half-read as one
            fail(other, f"belongs to {endpoint}; embeddings take an input")
    for name in payload:
        if name not in EMBEDDING_FIELDS:
            fields = ", ".join(sorted(EMBEDDING_FIELDS))
            fail(name, f"is not a field of an embeddings request (they take {fields})")
    embedding_inputs(payload.get("input"))
    dimensions = payload.get("dimensions")
    if dimensions is not None and (not is_int(dimensions) or dimensions < 1):
        fail("dimensions", "must be a positive integer")
    encoding = payload.get("encoding_format")
    if encoding is not None and encoding not in ENCODING_FORMATS:
        fail("encoding_format", f"must be one of {', '.join(ENCODING_FORMATS)}")
    truncate = payload.get("truncate_prompt_tokens")
    if truncate is not None and (not is_int(truncate) or truncate == 0 or truncate < -1):
        fail("truncate_prompt_tokens", "must be a positive integer, or -1 for the window")
    check_optional(payload, "user", str, "a string")


def embedding_inputs(raw: Any) -> list[str | list[int]]:
    """The inputs of an `input` field, one per vector asked for; ApiError 400 when it is not
    one of OpenAI's four shapes."""
    inputs = _listed(raw)
    if len(inputs) > MAX_INPUTS:
        fail("input", f"takes at most {MAX_INPUTS} inputs; got {len(inputs)}")
    for index, item in enumerate(inputs):
        where = "input" if isinstance(raw, str) else f"input[{index}]"
        if isinstance(item, str) and item:
            continue
        if isinstance(item, list) and item and all(_token(t) for t in item):
            continue
        fail(where, "must be a non-empty string or a non-empty array of token ids")
    return inputs


def _listed(raw: Any) -> list[Any]:
    if raw is None:
        fail("input", "is required: a text, a list of texts, or token ids")
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        fail("input", f"must be a string or an array, not {json_kind(raw)}")
    if not raw:
        fail("input", "must not be empty")
    return [raw] if all(is_int(t) for t in raw) else raw  # token ids: one input


def _token(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_TOKEN_ID
