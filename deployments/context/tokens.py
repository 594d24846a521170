"""Token counting with the served model's own tokenizer and chat template.

`ChatTemplateCounter` is exact: the prompt vLLM will see is the chat template applied to the
messages, so that is what we count. `CharEstimateCounter` is the anchors' approach (about four
characters a token), used only where no tokenizer is available, with a wider safety margin.
Content counts are cached by text, so a growing conversation only tokenizes its new turns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

Message = dict[str, Any]

CONTENT_CACHE_ENTRIES = 4096


class TokenCounter(Protocol):
    @property
    def exact(self) -> bool: ...

    def count_text(self, text: str) -> int:
        """Tokens of a piece of content, without template or special tokens."""
        ...

    def count_prompt(self, messages: Sequence[Message]) -> int:
        """Tokens of the whole prompt: the chat template over the messages, ready to generate."""
        ...


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


class ChatTemplateCounter:
    """Exact counts from a Hugging Face tokenizer and its chat template."""

    exact = True

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._encode = functools.lru_cache(maxsize=CONTENT_CACHE_ENTRIES)(self._encode_uncached)

    @classmethod
    def from_pretrained(cls, source: str | Path) -> ChatTemplateCounter:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(source)))

    def _encode_uncached(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def count_text(self, text: str) -> int:
        return int(self._encode(text))

    def count_prompt(self, messages: Sequence[Message]) -> int:
        # Rendered as vLLM renders them: content flattened to text (None becomes "").
        rendered = [{**m, "content": message_text(m)} for m in messages]
        encoded = self._tokenizer.apply_chat_template(
            rendered, tokenize=True, add_generation_prompt=True
        )
        ids = (
            encoded["input_ids"]
            if isinstance(encoded, dict) or hasattr(encoded, "keys")
            else encoded
        )
        return len(ids)


class CharEstimateCounter:
    """About `chars_per_token` characters a token, plus a few tokens of template per message."""

    exact = False

    def __init__(self, chars_per_token: float = 4.0, tokens_per_message: int = 4) -> None:
        self._chars_per_token = chars_per_token
        self._tokens_per_message = tokens_per_message

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / self._chars_per_token)

    def count_prompt(self, messages: Sequence[Message]) -> int:
        body = sum(self.count_text(message_text(m)) for m in messages)
        return body + self._tokens_per_message * (len(messages) + 1)
