"""What the fallback's engines share: the request they take and the pieces they give back.

Both engines (Ollama over its native API, llama.cpp in a child process) turn a chat into a stream of
text pieces and one closing `Finish`; `openai_format` turns that into OpenAI responses, so the
router cannot tell the fallback from a vLLM replica.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from core.types import FALLBACK_ENGINE_MARKER


@dataclass(frozen=True)
class ChatParams:
    """A chat already fitted to the fallback's window by the router."""

    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    # An answer cut short elsewhere, to be continued (its text counts toward max_tokens).
    continue_text: str = ""
    # OpenAI's `tools` and `tool_choice`, as plain JSON; calls come back as Hermes text.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None


@dataclass(frozen=True)
class CompletionParams:
    """A `/v1/completions` prompt already fitted by the router (a FIM prompt written out)."""

    prompt: str | list[int]
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    echo: bool = False  # the prompt's text first (not generated, not counted)


@dataclass(frozen=True)
class Piece:
    text: str


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" or "length", as OpenAI says it
    prompt_tokens: int
    completion_tokens: int


def gpu_env(n_gpu_layers: int, hidden: str = "") -> dict[str, str]:
    """The engine child's view of the node's GPUs: none unless layers are asked for. A CUDA
    build of llama.cpp at 0 layers still held 1.0-1.2 GiB of VRAM and ran prompt processing on
    a visible GPU (H200, 2026-11-26): VRAM that placement does not count, taken from the
    models it places there. `hidden` is how the engine reads "no device" (Ollama documents an
    invalid id, "-1"). With layers asked for, the marker lets the node's VRAM probe keep the
    engine's share while it restarts (`policy.fallback_vram`)."""
    if n_gpu_layers != 0:
        return {FALLBACK_ENGINE_MARKER: "1"}
    return {"CUDA_VISIBLE_DEVICES": hidden, "HIP_VISIBLE_DEVICES": hidden}


class EngineUnavailable(Exception):
    """The engine cannot serve now (not started, its server died): a backend fault."""


class PromptTooLong(Exception):
    """The prompt does not fit the engine's window: the client's problem, not the engine's."""


class InvalidChat(Exception):
    """The engine cannot render the conversation (its chat template rejects it): the client's."""


class FallbackEngine(Protocol):
    name: str
    parallel: int  # sequences it decodes at once; more wait their turn in the replica

    async def start(self) -> None:
        """Load the model; on return the engine serves."""
        ...

    def chat(self, params: ChatParams) -> AsyncGenerator[Piece | Finish, None]:
        """Text pieces as they are generated, then exactly one Finish."""
        ...

    def complete(self, params: CompletionParams) -> AsyncGenerator[Piece | Finish, None]:
        """The same for a raw prompt, no chat template."""
        ...

    async def check_health(self) -> None:
        """Raise EngineUnavailable if the engine cannot serve."""
        ...

    def close(self) -> None:
        """Let go of the engine (threads, processes) without waiting: also from `__del__`."""
        ...

    async def aclose(self) -> None:
        """Stop the engine and wait until its processes have exited."""
        ...


@runtime_checkable
class ReadsImages(Protocol):
    """An engine that reads images (llama-server with a projector, `fallback.mmproj`)."""

    async def image_tokens(self, sizes: Sequence[tuple[int, int]]) -> list[int]:
        """The tokens an image of each (width, height) adds to a chat prompt."""
        ...
