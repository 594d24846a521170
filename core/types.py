"""The shared vocabulary: roles, pools, priority classes, depths and reserved names.

Every layer speaks these words; this module imports nothing of ours and nothing heavy.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "AUTO_MODEL",
    "DEPLOYMENT_PREFIX",
    "FALLBACK_BACKEND",
    "FALLBACK_ENGINE_MARKER",
    "GIB",
    "Depth",
    "PoolKind",
    "PriorityClass",
    "Role",
]

AUTO_MODEL = "auto"  # the client-visible name that lets the depth router choose the role
FALLBACK_BACKEND = "cpu-fallback"  # the CPU link every chain ends on
DEPLOYMENT_PREFIX = "model:"  # Serve deployment names of model backends: model:<name>@<pool>
GIB = 1024**3
# In the environment of a fallback engine that may use a GPU: how a node's VRAM probe tells its
# processes from the models' (the fallback reserves no GPU with Ray).
FALLBACK_ENGINE_MARKER = "GPS_FALLBACK_ENGINE"


class Role(StrEnum):
    ORCHESTRATOR = "orchestrator"
    REASONING = "reasoning"
    VISION = "vision"
    CODING = "coding"
    # Vectors, not text: served on `/v1/embeddings` only (vLLM's pooling runner), never a link
    # of a chat's chain, and never failed over to another model (its vectors would not compare).
    EMBEDDING = "embedding"

    @property
    def generates(self) -> bool:
        """Whether the role answers chats and completions (every role but embedding)."""
        return self is not Role.EMBEDDING


class PoolKind(StrEnum):
    LOCAL = "local"
    MESH = "mesh"
    CLOUD = "cloud"


class PriorityClass(StrEnum):
    """Admission classes, most important first (see `rank`)."""

    USER = "user"
    AGENT = "agent"
    BACKGROUND = "background"

    @property
    def rank(self) -> int:
        return list(PriorityClass).index(self)


class Depth(StrEnum):
    """How much thought (and context) a `model: auto` request deserves."""

    QUICK = "quick"
    BALANCED = "balanced"
    DEEP = "deep"
    EXHAUSTIVE = "exhaustive"
