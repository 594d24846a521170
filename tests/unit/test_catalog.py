"""The open catalog: models by name, several per role, chains by name, keys limited to models,
and `/v1/models` (list and one card). Config through the loader; requests through the ingress
with a router that answers like an engine (tests/fakes/serve_handle.py)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.requests import Request

from cluster.backends import llm_config_for
from core.config import ClusterConfig, ConfigError, hash_key, parse_config
from core.errors import ApiError
from core.topology import Backend
from deployments.engine.adapters import ADAPTERS_ENV, ConfiguredAdapterLoader
from deployments.ingress.app import Ingress
from deployments.ingress.catalog import model_cards
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from tests.fakes import serve_handle

E2E = Path(__file__).parents[1] / "e2e"
CODERS = [
    {"name": "coder-small", "role": "coding", "source": "org/small", "context_window": 2048,
     "pools": ["local"]},
    {"name": "coder-big", "role": "coding", "default": True, "source": "org/big",
     "context_window": 8192, "aliases": ["big"], "pools": ["local"]},
]  # fmt: skip
KEYS = [
    {"name": "all", "sha256": hash_key("all-key")},
    {"name": "auto-coders", "sha256": hash_key("auto-key"), "models": ["auto", "coder-*"]},
    {"name": "coders", "sha256": hash_key("coders-key"), "models": ["coder-*"]},
    {"name": "small", "sha256": hash_key("small-key"), "models": ["coder-small"]},
]


def raw_config(**changes: Any) -> dict[str, Any]:
    """The e2e app's orchestrator, vision (without its adapter) and embedding models, and two
    named coding models."""
    raw: dict[str, Any] = yaml.safe_load((E2E / "gateway.yaml").read_text())
    kept = [m for m in raw["models"] if m.get("role") in ("orchestrator", "vision", "embedding")]
    for model in kept:
        model.pop("adapters", None)
    raw["models"] = kept + copy.deepcopy(CODERS)
    raw["chains"] = {"orchestrator": ["orchestrator@local", "coder-big@local", "cpu-fallback"]}
    raw["api_keys"] = copy.deepcopy(KEYS)
    raw.update(changes)
    return raw


def catalog(raw: dict[str, Any] | None = None) -> ClusterConfig:
    return parse_config(raw or raw_config(), base_dir=E2E, environ={})


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        catalog(raw)
    return str(caught.value)


# --- the config ----------------------------------------------------------------------------------


def test_a_role_reaches_its_default_model_and_every_name_reaches_its_own() -> None:
    served = catalog().served_names
    assert served["coding"] == "coder-big"  # default: true
    assert (served["coder-small"], served["coder-big"], served["big"]) == (
        "coder-small",
        "coder-big",
        "coder-big",
    )
    assert served["orchestrator"] == "orchestrator"  # unnamed: named by its role
    assert served["auto"] is None


def test_without_a_default_a_role_reaches_its_first_model() -> None:
    raw = raw_config()
    for model in raw["models"]:
        model.pop("default", None)
    assert catalog(raw).served_names["coding"] == "coder-small"


def test_a_model_fails_over_to_the_others_of_its_role_then_the_fallback() -> None:
    config = catalog()
    assert config.chain("coder-big") == ("coder-big@local", "coder-small@local", "cpu-fallback")
    assert config.chain("coder-small") == ("coder-small@local", "coder-big@local", "cpu-fallback")
    # A role's chain under `chains` is its default model's; the fallback ends text chains only.
    assert config.chain("orchestrator")[1] == "coder-big@local"
    assert config.chain("embedding") == ("embedding@local",)


def test_fallbacks_name_the_chain_and_the_cpu_fallback_always_ends_it() -> None:
    raw = raw_config()
    raw["models"][3]["fallbacks"] = ["orchestrator"]  # coder-small
    config = catalog(raw)
    assert config.chain("coder-small") == (
        "coder-small@local",
        "orchestrator@local",
        "cpu-fallback",
    )


def test_each_model_is_its_own_backend_and_engine_model_id() -> None:
    config = catalog()
    targets = config.targets
    assert {"coder-small@local", "coder-big@local"} <= set(targets)
    small = targets["coder-small@local"]
    assert (small.model_id, small.model, small.role, small.context_window) == (
        "coder-small",
        "coder-small",
        "coding",
        2048,
    )
    assert targets["cpu-fallback"].model is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"fallbacks": ["coder-huge"]}, "models[3].fallbacks: no model is named 'coder-huge'"),
        ({"fallbacks": ["coder-small"]}, "models[3].fallbacks: 'coder-small' lists itself"),
        ({"fallbacks": ["embedding"]}, "'embedding' does not serve text as 'coder-small' does"),
        ({"name": "vision"}, "models[3].name: 'vision' is a role's name"),
        ({"name": "auto"}, "models[3].name: 'auto' is a reserved name"),
        ({"name": "coder-big"}, "two models are named 'coder-big'"),
        ({"default": True}, "more than one model of role 'coding' is marked default"),
        ({"aliases": ["coder-big"]}, "'coder-big' is a model's or role's name"),
    ],
)
def test_a_catalog_that_cannot_be_resolved_is_refused_with_the_field(
    change: dict[str, Any], expected: str
) -> None:
    raw = raw_config()
    raw["models"][3].update(change)  # coder-small
    assert expected in refusal(raw)


def test_an_embedding_model_fails_over_to_no_other_by_default() -> None:
    raw = raw_config()
    raw["models"].append({**raw["models"][2], "name": "embed-two", "aliases": []})
    config = catalog(raw)
    assert config.chain("embed-two") == ("embed-two@local",)
    assert config.chain("embedding") == ("embedding@local",)


def test_a_model_named_like_its_role_must_be_its_default() -> None:
    raw = raw_config()
    raw["models"][3]["name"] = "coding"  # coder-small, beside coder-big marked default
    assert "'coding' names its role, whose name reaches 'coder-big'" in refusal(raw)


def test_remote_adapters_download_into_folders_of_their_own(tmp_path: Path) -> None:
    loader = ConfiguredAdapterLoader(lora_root=str(tmp_path))
    folders = {loader._model_dir_path(name) for name in ("coder-sql", "coder-docs", "org/x")}
    assert len(folders) == 3
    assert str(tmp_path) not in folders


def test_a_model_needs_a_name_or_a_role() -> None:
    raw = raw_config()
    del raw["models"][3]["role"], raw["models"][3]["name"]
    assert "a model needs a name (what clients send) or a role" in refusal(raw)


def test_a_model_without_a_role_is_reached_by_name_only() -> None:
    raw = raw_config()
    del raw["models"][3]["role"]
    config = catalog(raw)
    assert config.served_names["coder-small"] == "coder-small"
    assert config.served_names["coding"] == "coder-big"
    assert config.chain("coder-small") == ("coder-small@local", "cpu-fallback")
    raw["models"][3]["default"] = True
    assert "a default is the model its role's name reaches" in refusal(raw)


def test_the_reference_example_of_a_catalog_loads() -> None:
    """docs/configuration.md shows a two-model role, an adapter and a limited key: it loads."""
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    snippet = text.split("## The catalog: models by name")[1].split("```yaml")[1].split("```")[0]
    example = yaml.safe_load(snippet)
    example["api_keys"][0]["sha256"] = hash_key("k")
    raw = raw_config(api_keys=example["api_keys"], chains={})
    raw["pools"].append({"name": "cloud", "kind": "cloud"})
    raw["models"] = [*raw["models"][:3], *example["models"]]
    config = catalog(raw)
    assert config.served_names["coding"] == "coder-fast"
    assert config.chain("coder-large") == ("coder-large@cloud", "coder-fast@local", "cpu-fallback")
    assert config.base_model("coder-fast-sql").name == "coder-fast"


# --- requests through the ingress ----------------------------------------------------------------


def request(key: str, path: str, body: dict[str, Any] | None = None) -> Request:
    scope = {
        "type": "http",
        "method": "POST" if body is not None else "GET",
        "path": path,
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {key}".encode())],
    }
    chunks = [{"type": "http.request", "body": json.dumps(body or {}).encode()}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


@pytest.fixture
def router() -> serve_handle.EngineLikeRouter:
    return serve_handle.EngineLikeRouter()


@pytest.fixture
def ingress(router: serve_handle.EngineLikeRouter) -> Ingress:
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))
    return Ingress(catalog(), router, lambda: ledger)


def chat(ingress: Ingress, key: str, model: str) -> int | str:
    """The status of a chat for `model` with `key`, or the error's code."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        response = asyncio.run(ingress.chat(request(key, "/v1/chat/completions", body)))
    except ApiError as error:
        return f"{error.status} {error.code}"
    return response.status_code


def test_a_request_goes_to_the_model_its_name_reaches(
    ingress: Ingress, router: serve_handle.EngineLikeRouter
) -> None:
    for name in ("coding", "big", "coder-small", "orchestrator"):
        assert chat(ingress, "all-key", name) == 200
    assert [job.model for job in router.jobs] == [
        "coder-big",
        "coder-big",
        "coder-small",
        "orchestrator",
    ]


def test_a_limited_key_gets_403_for_other_models_whether_or_not_they_exist(
    ingress: Ingress,
) -> None:
    assert chat(ingress, "small-key", "coder-small") == 200
    for name in ("orchestrator", "coder-big", "coding", "no-such-model", "auto"):
        assert chat(ingress, "small-key", name) == "403 model_not_allowed", name
    # Within its globs: a name that does not exist is a 404; an alias reaching an allowed model
    # is allowed.
    assert chat(ingress, "coders-key", "coder-none") == "404 model_not_found"
    assert chat(ingress, "coders-key", "big") == 200
    assert chat(ingress, "coders-key", "coding") == 200
    assert chat(ingress, "all-key", "no-such-model") == "404 model_not_found"
    # `auto` listed: its choice (the orchestrator, for a short question) must be allowed too.
    assert chat(ingress, "auto-key", "auto") == "403 model_not_allowed"
    assert chat(ingress, "all-key", "auto") == 200


def listed(ingress: Ingress, key: str) -> list[str]:
    response = asyncio.run(ingress.models(request(key, "/v1/models")))
    return [card["id"] for card in json.loads(bytes(response.body))["data"]]


def test_the_model_list_shows_what_the_key_may_use(ingress: Ingress) -> None:
    everything = listed(ingress, "all-key")
    assert {"coder-small", "coder-big", "big", "coding", "orchestrator", "auto"} <= set(everything)
    assert listed(ingress, "small-key") == ["coder-small"]
    assert sorted(listed(ingress, "coders-key")) == ["big", "coder-big", "coder-small", "coding"]


def card(ingress: Ingress, key: str, model_id: str) -> dict[str, Any] | str:
    try:
        response = asyncio.run(ingress.model(model_id, request(key, f"/v1/models/{model_id}")))
    except ApiError as error:
        return f"{error.status} {error.code}"
    found: dict[str, Any] = json.loads(bytes(response.body))
    return found


def test_one_model_card_names_the_model_role_and_aliases(ingress: Ingress) -> None:
    big = card(ingress, "all-key", "big")
    assert isinstance(big, dict)
    assert (big["id"], big["object"], big["owned_by"]) == ("big", "model", "gpu-pool-serve")
    assert (big["model"], big["role"], big["aliases"], big["root"]) == (
        "coder-big",
        "coding",
        ["big"],
        "org/big",
    )
    assert card(ingress, "all-key", "nothing") == "404 model_not_found"
    assert card(ingress, "small-key", "coder-big") == "403 model_not_allowed"
    assert card(ingress, "small-key", "nothing") == "403 model_not_allowed"


def test_a_key_pattern_that_matches_no_model_is_refused() -> None:
    raw = raw_config()
    raw["api_keys"][3]["models"] = ["codr-*"]
    assert "api_keys[3].models: 'codr-*' matches no model, alias or role here" in refusal(raw)


# --- LoRA adapters -------------------------------------------------------------------------------


def adapter_folder(tmp_path: Path, rank: int = 8) -> str:
    folder = tmp_path / "sql-adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}))
    return str(folder)


def with_adapter(source: str, **model: Any) -> dict[str, Any]:
    raw = raw_config()
    raw["models"][4]["adapters"] = [{"name": "coder-big-sql", "source": source}]  # coder-big
    raw["models"][4].update(model)
    return raw


def test_an_adapter_is_a_model_name_served_by_its_base_models_backends(tmp_path: Path) -> None:
    config = catalog(with_adapter(adapter_folder(tmp_path)))
    assert config.served_names["coder-big-sql"] == "coder-big-sql"
    assert config.chain("coder-big-sql") == config.chain("coder-big")
    assert config.targets["coder-big@local"].adapters == ("coder-big-sql",)
    assert config.base_model("coder-big-sql").name == "coder-big"
    cards = model_cards(config, config.served_names, created=1)
    assert (cards["coder-big-sql"]["parent"], cards["coder-big-sql"]["root"]) == (
        "coder-big",
        str(tmp_path / "sql-adapter"),
    )
    assert cards["coder-big"]["parent"] is None


def test_the_cards_say_which_names_reach_a_model_that_reads_images(tmp_path: Path) -> None:
    raw = with_adapter(adapter_folder(tmp_path), images=True)  # coder-big reads images
    assert raw["models"][1]["role"] == "vision"
    raw["models"][1]["images"] = False  # said, not read from whatever `make model` built
    config = catalog(raw)
    cards = model_cards(config, config.served_names, created=1)
    readers = {name for name, card in cards.items() if "image" in card["input_modalities"]}
    # Its name, alias and role (it is coding's default), its adapter, and `auto`.
    assert readers == {"coder-big", "big", "coding", "coder-big-sql", "auto"}
    assert cards["coder-small"]["input_modalities"] == ["text"]


def test_a_model_with_adapters_runs_vllms_multi_lora_with_their_rank(tmp_path: Path) -> None:
    config = catalog(with_adapter(adapter_folder(tmp_path, rank=12)))
    built = llm_config_for(config, Backend(model="coder-big", pool="local"))
    kwargs = built.engine_kwargs
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 1, 16)
    assert built.lora_config is not None
    assert built.lora_config.max_num_adapters_per_replica == 1
    sources = json.loads(built.runtime_env["env_vars"][ADAPTERS_ENV])
    assert sources == {"coder-big-sql": str(tmp_path / "sql-adapter")}
    plain = llm_config_for(config, Backend(model="coder-small", pool="local"))
    assert "enable_lora" not in plain.engine_kwargs
    assert plain.lora_config is None


@pytest.mark.parametrize(
    ("source", "change", "expected"),
    [
        ("missing", {}, "models[4].adapters[0].source:"),
        ("s3://bucket/sql", {"aliases": ["coder-big-sql"]}, "already names a model, alias"),
        ("s3://bucket/sql", {"role": "embedding", "name": "e2"}, "serves no LoRA adapters"),
    ],
)
def test_an_adapter_that_cannot_be_served_is_refused(
    source: str, change: dict[str, Any], expected: str
) -> None:
    assert expected in refusal(with_adapter(source, **change))


# --- a vendor's names, by pattern ----------------------------------------------------------------

PATTERNS = {"claude-*haiku*": "orchestrator", "claude-*": "coding", "gpt-*": "auto"}


def patterned(**patterns: str) -> dict[str, Any]:
    raw = raw_config()
    raw.setdefault("gateway", {})["model_patterns"] = patterns or PATTERNS
    return raw


def test_a_vendors_model_name_reaches_the_first_pattern_that_matches_it(
    router: serve_handle.EngineLikeRouter,
) -> None:
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))
    ingress = Ingress(catalog(patterned()), router, lambda: ledger)
    for name in ("claude-haiku-4-5-20251001", "claude-sonnet-4-5", "gpt-5.1-codex", "big"):
        assert chat(ingress, "all-key", name) == 200
    assert [job.model for job in router.jobs] == [
        "orchestrator",
        "coder-big",
        "orchestrator",  # auto: the depth router's choice for a short question
        "coder-big",
    ]
    # A name no pattern matches is still unknown; a key is held to its own globs either way.
    assert chat(ingress, "all-key", "mistral-large") == "404 model_not_found"
    assert chat(ingress, "coders-key", "claude-sonnet-4-5") == 200  # reaches coder-big
    assert chat(ingress, "small-key", "claude-sonnet-4-5") == "403 model_not_allowed"


def test_a_pattern_that_reaches_no_served_name_is_refused() -> None:
    problem = refusal(patterned(**{"claude-*": "no-such-model"}))
    assert "gateway.model_patterns: 'claude-*' reaches 'no-such-model'" in problem
