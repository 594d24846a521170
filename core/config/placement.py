"""How models move between pools: the placement actor's VRAM thresholds and timings."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from core.config.base import Frozen

__all__ = ["PlacementConfig"]


class PlacementConfig(Frozen):
    """VRAM thresholds for the placement actor (hysteresis: restore_above > offload_below)."""

    interval_s: float = Field(15.0, gt=0, description="Between readings of free VRAM.")
    offload_below_gb: float = Field(
        6.0, ge=0, description="Free VRAM on a pool below which its lowest priority model leaves."
    )
    restore_above_gb: float = Field(
        12.0, ge=0, description="Free VRAM on its home pool above which a model comes back."
    )
    cooldown_s: float = Field(120.0, ge=0, description="Between two moves.")
    min_away_s: float = Field(
        60.0, ge=0, description="The least a model stays away before it returns."
    )
    move_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A move's target must be running and healthy within this long, or the "
        "move is abandoned (the source keeps serving).",
    )
    drain_timeout_s: float = Field(
        120.0,
        gt=0,
        description="The routers get this long to switch to the target, and the source's "
        "queued and in-flight requests this long to finish.",
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> Self:
        if self.restore_above_gb <= self.offload_below_gb:
            raise ValueError(
                f"restore_above_gb ({self.restore_above_gb}) must be greater than "
                f"offload_below_gb ({self.offload_below_gb}), or models would flap between pools"
            )
        return self
