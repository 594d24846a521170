"""A Responses request's input as the items a stored response keeps, and the pages of
`GET /v1/responses/{id}/input_items`. Plain dicts; what the items may hold is request.py's to
check (these run on input it has accepted, or on stored items)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policy.request.fields import fail, json_kind

__all__ = ["input_items", "page", "with_ids"]

Body = dict[str, Any]
MAX_PAGE = 100  # OpenAI's bounds of `limit`
DEFAULT_PAGE = 20
_TEXT_KIND = {"assistant": "output_text"}  # the other roles' text is input_text


def input_items(raw: Any) -> list[Body]:
    """The request's `input` as items: a string is one user message. What the items hold is
    the translation's to accept or refuse."""
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        fail("input", f"must be a string or a non-empty list of items, got {json_kind(raw)}")
    return list(raw)


def with_ids(items: Sequence[Body], rid: str) -> list[Body]:
    """The items as stored: each with an id (its own where it came with one) and a message's
    text as content parts, as OpenAI's input_items answers them."""
    kept: list[Body] = []
    for n, item in enumerate(items):
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                content = [
                    {"type": _TEXT_KIND.get(str(item.get("role")), "input_text"), "text": content}
                ]
            if isinstance(content, list):
                item["content"] = [_as_answered(part) for part in content]
            item.setdefault("status", "completed")
        if not isinstance(item.get("id"), str):
            prefix = "msg" if kind == "message" else "item"
            item["id"] = f"{prefix}_{rid.removeprefix('resp_')}_in{n}"
        kept.append(item)
    return kept


def _as_answered(part: Any) -> Any:
    """A content part with the fields OpenAI's answer gives it (the SDK's types want them)."""
    if not isinstance(part, dict):
        return part
    if part.get("type") == "output_text":
        return {"annotations": [], **part}
    if part.get("type") == "input_image":
        return {"detail": "auto", **part}
    return part


def page(items: Sequence[Body], query: dict[str, str]) -> Body:
    """One page of `items` (oldest first) as a list object: `order` (desc by default, as
    OpenAI's), `limit` (1 to 100, 20 by default), `after` an item id the page starts past."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        fail("order", "must be asc or desc")
    raw_limit = query.get("limit", str(DEFAULT_PAGE))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
        fail("limit", f"must be a whole number from 1 to {MAX_PAGE}")
    ordered = list(items) if order == "asc" else list(reversed(items))
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            fail("after", f"names no item of this response: {after[:100]!r}")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[: int(raw_limit)]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > len(data),
    }
