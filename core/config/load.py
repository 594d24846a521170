"""Reading a config: YAML in, a validated `ClusterConfig` out. The environment is read only here."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from core.config.base import ConfigError
from core.config.cluster import ClusterConfig
from core.types import PriorityClass

__all__ = [
    "API_KEYS_ENV",
    "EMBEDDED_CONFIG",
    "hash_key",
    "keys_from_env",
    "load_config",
    "parse_config",
]

API_KEYS_ENV = "GPU_POOL_SERVE_API_KEYS"
EMBEDDED_CONFIG = Path(__file__).resolve().parents[2] / "ray_configs" / "local.yaml"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_from_env(value: str) -> list[dict[str, str]]:
    """`key[:class]` entries, comma separated; the class is both default and cap."""
    entries = []
    for i, item in enumerate(filter(None, (part.strip() for part in value.split(",")))):
        # The class follows the last colon, so a key containing ':' needs an explicit class.
        key, colon, priority = item.rpartition(":")
        if not colon:
            key, priority = item, PriorityClass.USER.value
        if not key:
            raise ConfigError(f"{API_KEYS_ENV}: entry {i} has an empty key; remove it")
        entries.append(
            {
                "name": f"env-{i}",
                "sha256": hash_key(key),
                "priority": priority,
                "max_priority": priority,
            }
        )
    return entries


def parse_config(
    data: Any, *, base_dir: Path, environ: Mapping[str, str] | None = None
) -> ClusterConfig:
    """Validate a config mapping; keys from the environment are added, hashed, here."""
    if not isinstance(data, dict):
        raise ConfigError("config: the file must hold a mapping (pools:, models:, fallback:, ...)")
    environ = os.environ if environ is None else environ
    data = {**data, "base_dir": base_dir}
    env_keys = environ.get(API_KEYS_ENV, "")
    if env_keys.strip():
        data["api_keys"] = [*(data.get("api_keys") or ()), *keys_from_env(env_keys)]
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None
    # Which models read images, settled here from their files: every replica the config is
    # pickled to then agrees, whatever its node holds.
    models = tuple(
        m if m.images is not None else m.model_copy(update={"images": config.reads_images(m)})
        for m in config.models
    )
    return config.model_copy(update={"models": models})


def _overlaid(base: Any, overrides: Mapping[str, Any]) -> Any:
    """`base` with `overrides` laid over it: mappings merge key by key, anything else (a list, a
    value) replaces what was there."""
    if not isinstance(base, dict):
        return base  # not a config: parse_config says so
    result = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = _overlaid(result[key], value)
        else:
            result[key] = value
    return result


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Any = None,
) -> ClusterConfig:
    """Load and validate a YAML config (with no path, the embedded local default), `overrides`
    laid over it first: a Serve config's app args can adapt a shared file to one cluster
    (deploy/kuberay) instead of copying it."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError("config overrides: a mapping of config keys, e.g. {gateway: {...}}")
    file = Path(path).expanduser() if path else EMBEDDED_CONFIG
    try:
        text = file.read_text()
    except OSError as error:
        raise ConfigError(f"config: cannot read {file}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"config: {file} is not valid YAML: {error}") from None
    if overrides:
        data = _overlaid(data, overrides)
    try:
        return parse_config(data, base_dir=file.resolve().parent, environ=environ)
    except ConfigError as error:
        laid_over = " with its overrides" if overrides else ""
        raise ConfigError(f"invalid config {file}{laid_over}:\n{error}") from None


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        message = re.sub(r"^(Value error|Assertion failed), ", "", item["msg"])
        if item["type"] == "extra_forbidden":
            message = "is not a known key; check its spelling (README lists every key)"
        for line in message.splitlines():
            lines.append(f"  {where}: {line}" if where else f"  {line}")
    return "\n".join(lines)
