"""What a new config changes in a running app, and which of those changes apply in place.

A reload (`make reload`, cluster/reload.py) hands the running gateway a new config. What the
ingress and router decide per request takes it at once: keys and their limits, chains, caps,
roles and aliases, the gateway's request limits, the router's queue (shares, aging), breaker and
timeout settings, `model: auto`'s depth rules; the CPU fallback's own line follows the
router's aging, shares and engine numbers (deployments/fallback/turns.py). The set of models
changes too: a model added is started beside the app before the routers send it work, one
removed is drained and stopped, and one whose engine settings changed is replaced
make-before-break, as long as each runs on one pool without autoscaling (a model placement
moves, or load sizes, is the app's own). What else was built into a deployment (pools, the
fallback's section, a deployment option, where state is kept) is not changed by a reload: the
reload refuses the whole config, naming each such change, and the app runs on as it was.

Pure: two validated configs in, names of changed fields out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from core import topology
from core.config.cluster import ClusterConfig

__all__ = ["ReloadChanges", "reload_changes"]

# Sections a reload applies in place, whole.
LIVE_SECTIONS = frozenset({"api_keys", "chains", "depth"})
# Fields of `gateway` and `router` a reload applies in place; the others are built into a
# deployment (replica counts, resources, log encoding, health-check periods, engine flags, the
# loops' intervals) or say where state lives (keys_db).
LIVE_FIELDS = {
    # (max_json_depth also bounds the batch service's uploads, built with it.)
    "gateway": frozenset({"max_body_bytes", "max_messages", "default_priority", "model_patterns"}),
    "router": frozenset(
        {
            "max_queue",
            "class_shares",
            "aging_s",
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
            "preempt",
        }
    ),
}
# What the router alone reads of a model: its cap (an autoscaled model's is also its policy's
# per-replica load), and the names it answers to. Any other field is its engine's.
LIVE_MODEL_FIELDS = frozenset({"max_concurrency", "role", "default", "fallbacks", "aliases"})


@dataclass(frozen=True)
class ReloadChanges:
    """Changed fields, as dotted paths: `live` a reload applies in place, `fixed` it cannot."""

    live: tuple[str, ...]
    fixed: tuple[str, ...]
    # Models (by name) whose engines the reload starts, stops, or starts anew and then stops.
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()

    @property
    def applies(self) -> bool:
        """A reload goes ahead: something changes, and all of it in place."""
        return bool(self.live) and not self.fixed


def reload_changes(running: ClusterConfig, new: ClusterConfig) -> ReloadChanges:
    """Every field `new` changes from `running`, sorted into live and fixed."""
    old_dump, new_dump = _dump(running), _dump(new)
    live: list[str] = []
    fixed: list[str] = []
    models = _ModelChanges()
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
            models = _sort_models(before or [], after or [], live, fixed)
        else:
            fixed.append(section)
    if bool(running.api_keys) != bool(new.api_keys):  # auth on or off is a restart's decision
        fixed.append("api_keys (authentication on/off)")
    return ReloadChanges(tuple(live), tuple(fixed), *models.named())


def _dump(config: ClusterConfig) -> dict[str, Any]:
    """The config as JSON, each file path as the absolute path it points to: the same config
    from another folder, its relative paths adjusted, is the same config."""
    dump = config.model_dump(mode="json", exclude={"base_dir"})
    dump["gateway"]["keys_db"] = str(config.keys_db)
    dump["gateway"]["responses_db"] = str(config.responses_db)
    dump["batches"]["directory"] = str(config.batch_directory)
    fallback, raw_fallback = config.fallback, dump["fallback"]
    raw_fallback["source"] = config.fallback_source
    if fallback.mmproj:
        raw_fallback["mmproj"] = topology.fallback_mmproj(config)
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


@dataclass
class _ModelChanges:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)

    def named(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        return tuple(self.added), tuple(self.removed), tuple(self.replaced)


def _startable(raw: Mapping[str, Any]) -> bool:
    """A model whose engine a reload can start: on one pool, its count fixed."""
    return len(raw["pools"]) == 1 and raw["autoscaling"] is None


def _sort_models(
    before: list[dict[str, Any]], after: list[dict[str, Any]], live: list[str], fixed: list[str]
) -> _ModelChanges:
    old_models = {raw["name"]: raw for raw in before}
    new_models = {raw["name"]: raw for raw in after}
    changes = _ModelChanges()
    for name in sorted(new_models.keys() - old_models.keys()):
        if _startable(new_models[name]):
            live.append(f"models[{name}] (added)")
            changes.added.append(name)
        else:
            fixed.append(f"models[{name}] (added: a reload starts a model on one pool, "
                         "without autoscaling)")  # fmt: skip
    for name in sorted(old_models.keys() - new_models.keys()):
        if len(old_models[name]["pools"]) == 1:
            live.append(f"models[{name}] (removed)")
            changes.removed.append(name)
        else:
            fixed.append(f"models[{name}] (removed: placement moves it between pools)")
    common = [name for name in old_models if name in new_models]
    if common != [name for name in new_models if name in old_models]:
        live.append("models (order: the roles' default models)")
    for name in sorted(common):
        was, now = old_models[name], new_models[name]
        engine = []
        for key in _changed_keys(was, now):
            if key in LIVE_MODEL_FIELDS and (key != "max_concurrency" or not was["autoscaling"]):
                live.append(f"models[{name}].{key}")
            else:
                engine.append(f"models[{name}].{key}")
        if engine and _startable(was) and _startable(now):
            live.extend(f"{path} (engine replaced)" for path in engine)
            changes.replaced.append(name)
        else:
            fixed.extend(engine)
    return changes
