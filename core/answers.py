"""What an engine's replica answers with, as the router and the ingress read it: plain data.

A vLLM replica converts vLLM's response objects once, where it makes them
(deployments/engine/answers.py); the CPU fallback writes these itself. Over a handle an item is
one of: a whole answer (`WholeAnswer`), an engine's error (`EngineError`), an SSE line (`str`), or
a batch of SSE lines and errors (a list), as Ray Serve LLM batches a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EngineError", "Item", "Usage", "WholeAnswer"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class WholeAnswer:
    """A whole response: a chat completion, a text completion or embeddings, as OpenAI's JSON."""

    body: dict[str, Any]

    def usage(self) -> Usage:
        counted = self.body.get("usage")
        if not isinstance(counted, dict):
            return Usage()
        return Usage(
            int(counted.get("prompt_tokens") or 0), int(counted.get("completion_tokens") or 0)
        )


@dataclass(frozen=True)
class EngineError:
    """An engine's error, whole or in a stream: its HTTP status (None where it gave none), its
    type (e.g. BadRequestError, or one of our replicas' codes), message and the field at fault."""

    code: int | None
    kind: str
    message: str
    param: str | None = None

    def body(self) -> dict[str, Any]:
        """As OpenAI's (and vLLM's) error JSON."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.code,
                "param": self.param,
            }
        }


# A stream's batch: SSE lines, an error among them where the engine failed in its middle.
Item = WholeAnswer | EngineError | str | list[Any]
