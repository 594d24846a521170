"""The CPU fallback's share of a node's VRAM, kept for it while its engine restarts (pure).

The fallback replica reserves no GPU with Ray (`num_gpus=0`), yet with `fallback.n_gpu_layers`
set its engine child holds VRAM on the node. NVML counts that memory while the engine runs; but
the supervisor restarts a dead engine within seconds, and a placement round that read the node in
that gap would see the engine's share as free, place a model into it, and leave the engine
nothing to load into. So a node's probe remembers what the fallback's engine last held and keeps
that much out of the free VRAM it reports until the engine holds it again (a smaller figure
counts once two readings running agree: loading climbs), or until no engine of the fallback has
been seen on the node for `forget_after_s` (the replica moved, or was reconfigured with the GPU
hidden: then its engine carries no marker).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORGET_AFTER_S", "FallbackVram"]

# Longer than the supervisor's longest backoff (10 s) plus loading a large GGUF into VRAM.
FORGET_AFTER_S = 300.0


@dataclass(frozen=True)
class FallbackVram:
    """What the fallback's engine holds on one node now, and what it is owed while away."""

    held_bytes: int = 0  # held now by the node's fallback engine processes (NVML's count)
    reserved_bytes: int = 0  # what they last held: their share, whether or not they run now
    last_seen: float | None = None  # when an engine process of the fallback was last alive

    @property
    def withheld_bytes(self) -> int:
        """Free VRAM that is the fallback's all the same: its share less what it holds now."""
        return max(0, self.reserved_bytes - self.held_bytes)

    def observed(
        self, held_bytes: int, alive: bool, now: float, forget_after_s: float = FORGET_AFTER_S
    ) -> FallbackVram:
        """After one reading: `held_bytes` that the fallback's engine processes hold on the
        node's GPUs, `alive` whether any of them runs (it may still be loading)."""
        if held_bytes > 0:
            # A restarted engine holds its CUDA context before its layers: its share falls
            # only to a figure read twice running (loaded; or reconfigured with fewer layers).
            settled = held_bytes == self.held_bytes
            reserved = held_bytes if settled else max(held_bytes, self.reserved_bytes)
            return FallbackVram(held_bytes, reserved, now)
        if alive:  # started, not yet in VRAM: its share stays its own
            return FallbackVram(0, self.reserved_bytes, now)
        if self.last_seen is None or now - self.last_seen > forget_after_s:
            return FallbackVram()
        return FallbackVram(0, self.reserved_bytes, self.last_seen)  # between restarts
