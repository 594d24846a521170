"""Checks across sections: each returns its problems, naming the field and the fix."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

from core import topology
from core.types import AUTO_MODEL, FALLBACK_BACKEND, Role

if TYPE_CHECKING:
    from core.config.cluster import ClusterConfig
    from core.config.serving import ModelConfig, ToolsConfig

__all__ = ["cross_section_problems"]


def cross_section_problems(config: ClusterConfig) -> list[str]:
    return [
        *_unique_names(config),
        *_catalog(config),
        *_adapters(config),
        *_model_pools(config),
        *_caps(config),
        *_aliases(config),
        *_model_patterns(config),
        *_chains(config),
        *_keys(config),
        *_gateway_resource(config),
        *_image_limits(config),
        *_media_fetching(config),
    ]


# vLLM's own fetching of media by URL or path: the gateway fetches (gateway.media) and sends
# engines the bytes, and starts them fetching nothing (cluster/backends.py).
MEDIA_ENGINE_KWARGS = frozenset({"allowed_media_domains", "allowed_local_media_path"})


def _media_fetching(config: ClusterConfig) -> list[str]:
    return [
        f"models[{i}].engine_kwargs.{key}: the gateway fetches images itself and sends "
        "engines their bytes; list hosts in gateway.media.allowed_domains instead"
        for i, model in enumerate(config.models)
        for key in sorted(MEDIA_ENGINE_KWARGS & set(model.engine_kwargs))
    ]


def _image_limits(config: ClusterConfig) -> list[str]:
    """An engine that takes fewer images than the gateway lets through would refuse what the
    gateway admitted, after admission, as the client's fault."""
    most = config.gateway.media.max_images_per_request
    problems = []
    for i, model in enumerate(config.models):
        limits = model.engine_kwargs.get("limit_mm_per_prompt")
        image = limits.get("image") if isinstance(limits, dict) else None
        if isinstance(image, dict):  # vLLM's long form, {count: n, ...}
            image = image.get("count")
        if isinstance(image, int) and image < most:
            problems.append(
                f"models[{i}].engine_kwargs.limit_mm_per_prompt.image: {image} is fewer than "
                f"gateway.media.max_images_per_request ({most}); leave it out (the engine then "
                "takes the gateway's limit) or lower the gateway's"
            )
    return problems


def _unique_names(config: ClusterConfig) -> list[str]:
    problems = []
    pool_names = [p.name for p in config.pools]
    for name in sorted({n for n in pool_names if pool_names.count(n) > 1}):
        problems.append(f"pools: pool {name!r} is defined twice; give each pool its own name")
    names = [m.name for m in config.models]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(
            f"models: two models are named {name!r}; give each its own name (models[].name)"
        )
    return problems


def _catalog(config: ClusterConfig) -> list[str]:
    """Names that say what they reach: a model named like a role carries that role, one default
    per role, fallbacks that exist and serve the same kind."""
    names = {m.name: m for m in config.models}
    roles = {r.value for r in Role}
    problems = []
    for i, model in enumerate(config.models):
        if model.name in (AUTO_MODEL, FALLBACK_BACKEND):
            problems.append(f"models[{i}].name: {model.name!r} is a reserved name; pick another")
        elif model.name in roles and (model.role is None or model.role.value != model.name):
            problems.append(
                f"models[{i}].name: {model.name!r} is a role's name, and `model: {model.name}` "
                f"must reach a model of that role; set role: {model.name} or pick another name"
            )
        elif model.role is not None and model.name == model.role.value:
            default = topology.default_model(config, model.role)
            if default != model.name:
                problems.append(
                    f"models[{i}].name: {model.name!r} names its role, whose name reaches "
                    f"{default!r} (marked default); rename this model or mark it default"
                )
        if model.default and model.role is None:
            problems.append(
                f"models[{i}].default: a default is the model its role's name reaches; set a "
                "role or remove default"
            )
        problems += _fallbacks(i, model.name, model.fallbacks, names)
    tagged = [m.role for m in config.models if m.default and m.role is not None]
    for role in sorted({r for r in tagged if tagged.count(r) > 1}):
        problems.append(
            f"models: more than one model of role {role.value!r} is marked default; mark one"
        )
    return problems


def _adapters(config: ClusterConfig) -> list[str]:
    """Adapter names are names of their own; a local adapter is a PEFT folder; an embedding
    model takes none."""
    taken = {r.value for r in Role} | {AUTO_MODEL, FALLBACK_BACKEND}
    taken |= {m.name for m in config.models} | {a for m in config.models for a in m.aliases}
    seen: set[str] = set()
    problems = []
    for i, model in enumerate(config.models):
        for j, adapter in enumerate(model.adapters):
            where = f"models[{i}].adapters[{j}]"
            if adapter.name in taken or adapter.name in seen:
                problems.append(
                    f"{where}.name: {adapter.name!r} already names a model, alias, role or "
                    "adapter; give the adapter a name of its own"
                )
            seen.add(adapter.name)
            folder = Path(config.adapter_source(adapter))
            if not adapter.remote and not (folder / "adapter_config.json").is_file():
                problems.append(
                    f"{where}.source: {folder} holds no adapter_config.json; give a folder in "
                    "PEFT's format (relative to this config file) or an s3://, gs://, abfss:// "
                    "or azure:// folder"
                )
        if model.adapters and not model.generates:
            problems.append(f"models[{i}].adapters: an embedding model serves no LoRA adapters")
    return problems


def _fallbacks(
    i: int, name: str, fallbacks: Sequence[str], names: dict[str, ModelConfig]
) -> list[str]:
    where = f"models[{i}].fallbacks"
    problems = []
    for other in fallbacks:
        if other == FALLBACK_BACKEND:
            continue
        if other == name:
            problems.append(f"{where}: {name!r} lists itself; list other models")
        elif other not in names:
            problems.append(
                f"{where}: no model is named {other!r}; use one of {sorted(names)} or "
                f"{FALLBACK_BACKEND!r}"
            )
        elif names[other].generates != names[name].generates:
            kind = "text" if names[name].generates else "vectors"
            problems.append(f"{where}: {other!r} does not serve {kind} as {name!r} does")
    repeated = sorted({f for f in fallbacks if fallbacks.count(f) > 1})
    if repeated:
        problems.append(f"{where}: {', '.join(repeated)} is listed more than once; list it once")
    if FALLBACK_BACKEND in fallbacks and not names[name].generates:
        problems.append(
            f"{where}: {FALLBACK_BACKEND!r} serves text, not vectors; an embedding model's "
            "fallbacks are embedding models"
        )
    return problems


def _model_pools(config: ClusterConfig) -> list[str]:
    known = {p.name for p in config.pools}
    problems = []
    for i, model in enumerate(config.models):
        for pool in model.pools:
            if pool not in known:
                problems.append(
                    f"models[{i}].pools: pool {pool!r} does not exist; define it under pools "
                    f"or use one of {sorted(known)}"
                )
        if "max_model_len" in model.engine_kwargs:
            problems.append(
                f"models[{i}].engine_kwargs.max_model_len: set context_window instead; the "
                "router fits requests to context_window and passes it to vLLM"
            )
        problems += _missing_template(config, model.tools, f"models[{i}]")
        for key in sorted(TOOL_ENGINE_KWARGS & set(model.engine_kwargs)):
            problems.append(
                f"models[{i}].engine_kwargs.{key}: set models[{i}].tools instead (parser, "
                "auto_choice, strict, chat_template); the gateway checks requests against it"
            )
        if len(set(model.pools)) != len(model.pools):
            problems.append(f"models[{i}].pools: a pool is listed twice; list each once")
        if "runner" in model.engine_kwargs:
            problems.append(
                f"models[{i}].engine_kwargs.runner: the role decides it (pooling for "
                "embedding, generate for the others); remove it"
            )
        if not model.generates and model.tools is not None:
            problems.append(f"models[{i}].tools: an embedding model calls no tools; remove it")
    problems += _missing_template(config, config.fallback.tools, "fallback")
    if config.fallback.pool is not None and config.fallback.pool not in known:
        problems.append(
            f"fallback.pool: pool {config.fallback.pool!r} does not exist; define it under "
            "pools or leave fallback.pool empty to run on the head node"
        )
    return problems


def _missing_template(config: ClusterConfig, tools: ToolsConfig | None, where: str) -> list[str]:
    template = config.tools_template(tools) if tools is not None else None
    if template is None or template.is_file():
        return []
    return [
        f"{where}.tools.chat_template: {template} is not a file; give the path of a Jinja chat "
        "template, relative to this config file"
    ]


def _caps(config: ClusterConfig) -> list[str]:
    fix = "must be at least 1 (a cap of 0 would refuse every request); raise it or remove it"
    problems = [
        f"models[{i}].max_concurrency {fix}"
        for i, m in enumerate(config.models)
        if m.max_concurrency is not None and m.max_concurrency < 1
    ]
    if config.fallback.max_concurrency < 1:
        problems.append(f"fallback.max_concurrency {fix}")
    replicas = config.gateway.router_shares
    if replicas > 1:
        which = "ingress_replicas" if config.gateway.router_in_ingress else "router_replicas"
        share = (
            f"must be at least gateway.{which} ({replicas}): each router enforces "
            f"cap // replicas; raise the cap or lower {which}"
        )
        problems.extend(
            f"models[{i}].max_concurrency ({m.cap}) {share}"
            for i, m in enumerate(config.models)
            if m.cap < replicas
        )
        fallback_cap = config.fallback.max_concurrency
        if fallback_cap < replicas:
            problems.append(f"fallback.max_concurrency ({fallback_cap}) {share}")
    return problems


def _aliases(config: ClusterConfig) -> list[str]:
    reserved = {r.value for r in Role} | {AUTO_MODEL, FALLBACK_BACKEND}
    reserved |= {m.name for m in config.models}
    seen: dict[str, int] = {}
    problems = []
    for i, model in enumerate(config.models):
        for alias in model.aliases:
            if alias in reserved:
                problems.append(
                    f"models[{i}].aliases: {alias!r} is a model's or role's name (or reserved); "
                    "pick another"
                )
            elif alias in seen:
                problems.append(
                    f"models[{i}].aliases: {alias!r} is already an alias of models"
                    f"[{seen[alias]}]; each alias must name exactly one model"
                )
            else:
                seen[alias] = i
    return problems


def _model_patterns(config: ClusterConfig) -> list[str]:
    served = config.served_names
    return [
        f"gateway.model_patterns: {pattern!r} reaches {name!r}, which no model, alias, role "
        f"or adapter here is named (served: {', '.join(served)})"
        for pattern, name in config.gateway.model_patterns.items()
        if name not in served
    ]


def _chains(config: ClusterConfig) -> list[str]:
    models = {m.name: m for m in config.models}
    roles = {m.role.value: m for m in config.models if m.role is not None}
    generates = {b.name: models[b.model].generates for b in topology.backends(config)}
    problems = []
    for key, links in config.chains.items():
        where = f"chains.{key}"
        owner = models.get(key) or roles.get(key)
        if owner is None:
            problems.append(
                f"{where}: no model is named {key!r} and no model has that role; name a model "
                "or a served role, or drop it"
            )
            continue
        unknown = [link for link in links if link not in generates and link != FALLBACK_BACKEND]
        for link in unknown:
            problems.append(
                f"{where}: {link!r} is not a backend; use model@pool for a configured model "
                f"and pool, or {FALLBACK_BACKEND!r}"
            )
        repeated = sorted({link for link in links if links.count(link) > 1})
        if repeated:
            problems.append(
                f"{where}: {', '.join(repeated)} appears more than once, which would loop; "
                "list each backend once"
            )
        problems += _fallback_place(owner.generates, links, where)
        problems += _mixed_kinds(owner.generates, key, links, generates, where)
    return problems


def _fallback_place(text: bool, links: Sequence[str], where: str) -> list[str]:
    """A text chain ends on the CPU fallback; an embedding chain never lists it (it serves text,
    and another model's vectors would not compare with the ones already stored)."""
    if not text:
        if FALLBACK_BACKEND in links:
            return [
                f"{where}: {FALLBACK_BACKEND!r} serves text, not vectors; an embedding chain "
                "lists embedding backends only"
            ]
        return [] if links else [f"{where}: list at least one embedding backend"]
    if not links or links[-1] != FALLBACK_BACKEND:
        return [
            f"{where}: the chain must end on {FALLBACK_BACKEND!r}, the CPU replica that "
            "cannot run out of GPU memory; append it"
        ]
    if FALLBACK_BACKEND in links[:-1]:
        return [f"{where}: {FALLBACK_BACKEND!r} may only be the last link"]
    return []


def _mixed_kinds(
    text: bool, key: str, links: Sequence[str], generates: dict[str, bool], where: str
) -> list[str]:
    """An embedding chain holds embedding backends only; a text chain holds none."""
    wrong = [link for link in links if link in generates and generates[link] != text]
    kind = "vectors" if text else "text"
    return [
        f"{where}: {link!r} serves {kind}, not what {key!r} answers; list backends of the same kind"
        for link in wrong
    ]


# vLLM options that `models[].tools` owns.
TOOL_ENGINE_KWARGS = frozenset(
    {"enable_auto_tool_choice", "tool_call_parser", "chat_template", "tool_strict_level"}
)


def _keys(config: ClusterConfig) -> list[str]:
    names = [k.name for k in config.api_keys]
    hashes = [k.sha256 for k in config.api_keys]
    problems = [
        f"api_keys: key name {n!r} is used twice; name each key once"
        for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if len(set(hashes)) != len(hashes):
        problems.append("api_keys: the same key is listed twice; remove the duplicate")
    problems += [
        f"api_keys: {k.name!r} is the digest of a well-known password; make a real key with "
        "`python -m cluster.keys new`"
        for k in config.api_keys
        if k.sha256 in _GUESSABLE_DIGESTS
    ]
    served = topology.served_names(config)
    for i, key in enumerate(config.api_keys):
        for pattern in key.models or ():
            if not any(fnmatchcase(name, pattern) for name in served):
                problems.append(
                    f"api_keys[{i}].models: {pattern!r} matches no model, alias or role here; "
                    f"use one of {sorted(served)} or a glob over them"
                )
    return problems


# Keys anyone would try first (and that example configs have shipped); refused at load.
_GUESSABLE_KEYS = (
    "password", "passw0rd", "123456", "12345678", "123456789", "qwerty", "admin", "root",
    "secret", "changeme", "letmein", "test", "key", "apikey", "api-key", "sk-1234", "default",
)  # fmt: skip
_GUESSABLE_DIGESTS = frozenset(hashlib.sha256(key.encode()).hexdigest() for key in _GUESSABLE_KEYS)


def _gateway_resource(config: ClusterConfig) -> list[str]:
    resource = config.gateway.resource
    if resource is not None and resource in {p.resource for p in config.pools}:
        return [
            f"gateway.resource: {resource!r} is a pool's resource; the gateway must not stand on "
            "a pool that can die: use a resource only gateway nodes carry (e.g. 'gateway')"
        ]
    return []
