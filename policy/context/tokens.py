"""Token counting with the served model's own tokenizer and chat template.

`ChatTemplateCounter` is exact: the prompt vLLM will see is the chat template applied to the
messages, so that is what we count. `CharEstimateCounter` is the anchors' approach (about four
characters a token), used only where no tokenizer is available, with a wider safety margin.
Content counts are cached by text, so a growing conversation only tokenizes its new turns.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "CONTENT_CACHE_ENTRIES",
    "KNOWN_FIM_MARKERS",
    "PLAIN_KEYS",
    "PLAIN_ROLES",
    "CharEstimateCounter",
    "ChatTemplateCounter",
    "FimMarkers",
    "Message",
    "TokenCounter",
    "is_plain",
    "message_text",
    "template_message",
]

Message = dict[str, Any]

CONTENT_CACHE_ENTRIES = 4096
_UNREAD = object()
TOOLS_CACHE_ENTRIES = 256


class TokenCounter(Protocol):
    @property
    def exact(self) -> bool: ...

    def count_text(self, text: str) -> int:
        """Tokens of a piece of content, without template or special tokens."""
        ...

    def count_prompt(
        self, messages: Sequence[Message], tools: Sequence[Message] | None = None
    ) -> int:
        """Tokens of the whole prompt: the chat template over the messages (and the tools it
        lists), ready to generate."""
        ...

    def upper_bound(self, messages: Sequence[Message]) -> int | None:
        """A cheap count never below `count_prompt`, or None where no such bound is known."""
        ...

    def count_tools(self, tools: Sequence[Message]) -> int:
        """Tokens that listing `tools` adds to a prompt (the template renders them once)."""
        ...

    def count_raw(self, text: str) -> int:
        """Tokens of a completion prompt as the engine tokenizes it (no template; the
        tokenizer's own special tokens, such as a BOS, included)."""
        ...

    def tail(self, text: str, tokens: int) -> str:
        """The longest end of `text` that is at most `tokens` tokens."""
        ...

    def fim_markers(self) -> FimMarkers | None:
        """The tokenizer's fill-in-the-middle markers, or None where it has none."""
        ...


@dataclass(frozen=True)
class FimMarkers:
    """A prompt for fill-in-the-middle, in the prefix-suffix-middle order every FIM-trained
    model knows: `{prefix}<text before>{suffix}<text after>{middle}`."""

    prefix: str
    suffix: str
    middle: str

    def prompt(self, before: str, after: str) -> str:
        return f"{self.prefix}{before}{self.suffix}{after}{self.middle}"


# The markers of the FIM-trained families, as their tokenizers spell them.
KNOWN_FIM_MARKERS = (
    FimMarkers("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    FimMarkers("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Granite
    FimMarkers(  # DeepSeek-Coder
        "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"
    ),
)


def message_text(message: Message) -> str:
    """The text of a message's content (text parts joined; other parts carry no text)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def template_message(message: Message) -> Message:
    """A message as vLLM hands it to a chat template: content flattened to text (None becomes
    ""), and a call's `arguments` parsed from their JSON string into an object (not JSON, or not
    an object: `{}`), so a template writes them as it would its own (`tojson`)."""
    rendered = {**message, "content": message_text(message)}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        if not calls:
            del rendered["tool_calls"]
        else:
            rendered["tool_calls"] = [_parsed_call(call) for call in calls]
    return rendered


def _parsed_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except ValueError:
            arguments = {}
    return {**call, "function": {**function, "arguments": arguments or {}}}


# Messages the byte bound covers: their whole rendering is the role's frame plus the content.
PLAIN_ROLES = frozenset({"system", "user", "assistant"})
PLAIN_KEYS = frozenset({"role", "content"})


def is_plain(message: Message) -> bool:
    return message.get("role") in PLAIN_ROLES and message.keys() <= PLAIN_KEYS


class ChatTemplateCounter:
    """Exact counts from a Hugging Face tokenizer and its chat template.

    Short requests skip tokenizing: every token of byte-level BPE (and of SentencePiece with byte
    fallback) covers at least one UTF-8 byte, so a message's content costs at most its byte length
    plus one (a leading-space marker), and its frame costs what the template measured once at
    load. When that bound already fits the window, nothing needs counting.
    """

    exact = True

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self._tokenizer = tokenizer
        # The engine's template where it is not the tokenizer's own (models[].tools).
        self._template = chat_template
        self._encode = functools.lru_cache(maxsize=CONTENT_CACHE_ENTRIES)(self._encode_uncached)
        # Agents send the same tools on every call: their cost is measured once (by digest,
        # so the cache holds numbers, not the listings).
        self._tools_costs: dict[str, int] = {}
        self._fim: FimMarkers | object | None = _UNREAD
        self._frame = self._measure_frame()

    def _measure_frame(self) -> tuple[int, int] | None:
        """(prompt overhead, per-message overhead) of the template, or None if it will not say."""
        try:
            empty = {"content": ""}
            base = self.count_prompt([{**empty, "role": "user"}])
            grown = [
                self.count_prompt([{**empty, "role": "system"}, {**empty, "role": "user"}]),
                self.count_prompt(
                    [
                        {**empty, "role": "user"},
                        {**empty, "role": "assistant"},
                        {**empty, "role": "user"},
                    ]
                ),
            ]
        except Exception:  # noqa: BLE001 - a template that rejects empty or unusual turns: always count
            return None
        # `base` holds the generation prompt and any default system prompt the template adds
        # when none is given; counting it twice also covers a system message's own frame.
        per_message = max(grown[0] - base, (grown[1] - base + 1) // 2, 0)
        return 2 * base, per_message + 2

    @classmethod
    def from_pretrained(
        cls, source: str | Path, chat_template: str | Path | None = None
    ) -> ChatTemplateCounter:
        """The tokenizer at `source`, rendering with its own chat template or the one in the
        file `chat_template`."""
        from policy.context.tokenizer_files import load_tokenizer

        template = Path(chat_template).read_text() if chat_template is not None else None
        # A GGUF (llama.cpp's file) carries the tokenizer and chat template too.
        return cls(load_tokenizer(source), template)

    def _encode_uncached(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def count_text(self, text: str) -> int:
        return int(self._encode(text))

    def count_prompt(
        self, messages: Sequence[Message], tools: Sequence[Message] | None = None
    ) -> int:
        rendered = [template_message(m) for m in messages]  # as vLLM renders them
        encoded = self._tokenizer.apply_chat_template(
            rendered,
            tools=list(tools) if tools else None,
            chat_template=self._template,
            tokenize=True,
            add_generation_prompt=True,
        )
        ids = (
            encoded["input_ids"]
            if isinstance(encoded, dict) or hasattr(encoded, "keys")
            else encoded
        )
        return len(ids)

    def upper_bound(self, messages: Sequence[Message]) -> int | None:
        if self._frame is None or not all(is_plain(m) for m in messages):
            return None
        base, per_message = self._frame
        content = sum(len(message_text(m).encode()) + 1 for m in messages)
        return base + per_message * len(messages) + content

    def count_raw(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=True))

    def tail(self, text: str, tokens: int) -> str:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= tokens:
            return text
        if tokens <= 0:
            return ""
        kept: str = self._tokenizer.decode(ids[-tokens:])
        # A cut inside a character decodes to U+FFFD: begin after it.
        return kept.lstrip("\ufffd")

    def fim_markers(self) -> FimMarkers | None:
        if self._fim is _UNREAD:  # the vocabulary is read once (tens of ms)
            vocab = self._tokenizer.get_vocab()
            self._fim = next(
                (
                    markers
                    for markers in KNOWN_FIM_MARKERS
                    if {markers.prefix, markers.suffix, markers.middle} <= vocab.keys()
                ),
                None,
            )
        return self._fim  # type: ignore[return-value]

    def count_tools(self, tools: Sequence[Message]) -> int:
        listed = json.dumps(list(tools), sort_keys=True).encode()
        digest = hashlib.sha256(listed).hexdigest()
        cost = self._tools_costs.get(digest)
        if cost is None:
            probe = [{"role": "user", "content": ""}]
            cost = max(0, self.count_prompt(probe, tools) - self.count_prompt(probe))
            if len(self._tools_costs) >= TOOLS_CACHE_ENTRIES:
                self._tools_costs.pop(next(iter(self._tools_costs)))  # the oldest
            self._tools_costs[digest] = cost
        return cost


class CharEstimateCounter:
    """About `chars_per_token` characters a token, plus a few tokens of template per message."""

    exact = False

    def __init__(self, chars_per_token: float = 4.0, tokens_per_message: int = 4) -> None:
        self._chars_per_token = chars_per_token
        self._tokens_per_message = tokens_per_message

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / self._chars_per_token)

    def count_prompt(
        self, messages: Sequence[Message], tools: Sequence[Message] | None = None
    ) -> int:
        body = sum(self.count_text(message_text(m)) for m in messages)
        listed = self.count_tools(tools) if tools else 0
        return body + listed + self._tokens_per_message * (len(messages) + 1)

    def upper_bound(self, messages: Sequence[Message]) -> int | None:
        return None  # an estimate bounds nothing

    def count_tools(self, tools: Sequence[Message]) -> int:
        # The definitions as JSON, and as much again for the instructions around them.
        return 2 * self.count_text(json.dumps(list(tools)))

    def count_raw(self, text: str) -> int:
        return self.count_text(text) + 1  # a BOS, perhaps

    def tail(self, text: str, tokens: int) -> str:
        keep = max(0, int(tokens * self._chars_per_token))
        return text[len(text) - keep :] if keep < len(text) else text

    def fim_markers(self) -> FimMarkers | None:
        return None  # no tokenizer, no markers to find
