"""What every config section is built from: frozen models, read-only dicts, checked names."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "SHA256_HEX",
    "ConfigError",
    "EngineKwargs",
    "EnvVars",
    "Frozen",
    "FrozenDict",
    "ModelName",
    "Name",
    "frozen_dict",
]


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which field and how to fix it."""


class FrozenDict(dict[Any, Any]):
    """A dict that refuses changes, so a validated config stays validated; pickles for Ray."""

    def _read_only(self, *_: Any, **__: Any) -> None:
        raise TypeError("the cluster config is read-only; change the YAML file instead")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


def frozen_dict(value: dict[Any, Any]) -> FrozenDict:
    return FrozenDict(value)


Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=40)]
# Client-visible model names look like `qwen2.5-7b`, `llama3:8b` or `org/model`.
ModelName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", max_length=100)]
EngineKwargs = Annotated[dict[str, Any], AfterValidator(frozen_dict)]
EnvVars = Annotated[dict[str, str], AfterValidator(frozen_dict)]
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class Frozen(BaseModel):
    """A config section: immutable, and unknown keys are errors (typos never pass)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
