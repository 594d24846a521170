"""What a new config changes in a running app, and which of those changes apply in place.

A reload (`make reload`, cluster/reload.py) hands the running gateway a new config. What the
ingress and router decide per request takes it at once: keys and their limits, chains, caps,
the gateway's request limits, the router's queue, breaker and timeout settings, `model: auto`'s
depth rules. What was built into a deployment (an engine's settings, a pool, replica counts, a
deployment option, where state is kept) is not changed by a reload: the reload refuses the
whole config, naming each such change, and the app runs on as it was.

Pure: two validated configs in, names of changed fields out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from core.config.cluster import ClusterConfig

__all__ = ["ReloadChanges", "reload_changes"]

# Sections a reload applies in place, whole.
LIVE_SECTIONS = frozenset({"api_keys", "chains", "depth"})
# Fields of `gateway` and `router` a reload applies in place; the others are built into a
# deployment (replica counts, resources, log encoding, health-check periods, engine flags, the
# loops' intervals, the fallback's turn aging) or say where state lives (keys_db).
LIVE_FIELDS = {
    # (max_json_depth also bounds the batch service's uploads, built with it.)
    "gateway": frozenset({"max_body_bytes", "max_messages", "default_priority"}),
    "router": frozenset(
        {
            "max_queue",
            "class_shares",
            "queue_timeout_s",
            "retry_after_s",
            "breaker_failures",
            "breaker_cooldown_s",
            "half_open_probes",
            "kv_cache_high",
            "kv_cache_resume_factor",
            "kv_stale_after_s",
            "first_token_timeout_s",
            "stream_idle_timeout_s",
            "engine_priorities",
        }
    ),
}
# The router's cap on a backend; an autoscaled model's is also its policy's per-replica load.
LIVE_MODEL_FIELDS = frozenset({"max_concurrency"})


@dataclass(frozen=True)
class ReloadChanges:
    """Changed fields, as dotted paths: `live` a reload applies in place, `fixed` it cannot."""

    live: tuple[str, ...]
    fixed: tuple[str, ...]

    @property
    def applies(self) -> bool:
        """A reload goes ahead: something changes, and all of it in place."""
        return bool(self.live) and not self.fixed


def reload_changes(running: ClusterConfig, new: ClusterConfig) -> ReloadChanges:
    """Every field `new` changes from `running`, sorted into live and fixed."""
    old_dump, new_dump = _dump(running), _dump(new)
    live: list[str] = []
    fixed: list[str] = []
    for section in sorted(old_dump.keys() | new_dump.keys()):
        before, after = old_dump.get(section), new_dump.get(section)
        if before == after:
            continue
        if section in LIVE_SECTIONS:
            live.append(section)
        elif section in LIVE_FIELDS:
            for name in _changed_keys(before or {}, after or {}):
                (live if name in LIVE_FIELDS[section] else fixed).append(f"{section}.{name}")
        elif section == "models":
            _sort_models(before or [], after or [], live, fixed)
        else:
            fixed.append(section)
    if bool(running.api_keys) != bool(new.api_keys):  # auth on or off is a restart's decision
        fixed.append("api_keys (authentication on/off)")
    return ReloadChanges(tuple(live), tuple(fixed))


def _dump(config: ClusterConfig) -> dict[str, Any]:
    """The config as JSON, each file path as the absolute path it points to: the same config
    from another folder, its relative paths adjusted, is the same config."""
    dump = config.model_dump(mode="json", exclude={"base_dir"})
    dump["gateway"]["keys_db"] = str(config.keys_db)
    dump["batches"]["directory"] = str(config.batch_directory)
    fallback, raw_fallback = config.fallback, dump["fallback"]
    raw_fallback["source"] = config.fallback_source
    if fallback.tokenizer:
        raw_fallback["tokenizer"] = config.resolve_path(fallback.tokenizer)
    if fallback.tools is not None:
        raw_fallback["tools"]["chat_template"] = str(config.tools_template(fallback.tools))
    for raw, model in zip(dump["models"], config.models, strict=True):
        raw["source"] = config.resolve_path(model.source)
        for raw_adapter, adapter in zip(raw["adapters"], model.adapters, strict=True):
            raw_adapter["source"] = config.adapter_source(adapter)
        if model.tools is not None:
            raw["tools"]["chat_template"] = str(config.tools_template(model.tools))
    return dump


def _changed_keys(before: Mapping[str, Any], after: Mapping[str, Any]) -> Iterator[str]:
    for key in sorted(before.keys() | after.keys()):
        if before.get(key) != after.get(key):
            yield key


def _sort_models(
    before: list[dict[str, Any]], after: list[dict[str, Any]], live: list[str], fixed: list[str]
) -> None:
    old_models = {raw["name"]: raw for raw in before}
    new_models = {raw["name"]: raw for raw in after}
    if list(old_models) != list(new_models):  # added, removed or reordered (role defaults)
        fixed.append("models (added, removed or reordered)")
    for name in sorted(old_models.keys() & new_models.keys()):
        was = old_models[name]
        for key in _changed_keys(was, new_models[name]):
            in_place = key in LIVE_MODEL_FIELDS and was["autoscaling"] is None
            (live if in_place else fixed).append(f"models[{name}].{key}")
