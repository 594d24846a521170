"""Unit tests for cluster/config.py: loading, derived facts and the checks on bad configs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from core.config import (
    EMBEDDED_CONFIG,
    ClusterConfig,
    ConfigError,
    hash_key,
    load_config,
    parse_config,
)
from core.types import AUTO_MODEL, FALLBACK_BACKEND, PriorityClass, Role

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_CONFIG = REPO_ROOT / "tests" / "e2e" / "gateway.yaml"

BASE: dict[str, Any] = {
    "pools": [
        {"name": "local", "kind": "local"},
        {"name": "cloud", "kind": "cloud", "priority": 1},
    ],
    "models": [
        {
            "role": "orchestrator",
            "source": "./models/orc",
            "aliases": ["orc"],
            "context_window": 4096,
            "pools": ["local", "cloud"],
        },
        {
            "role": "coding",
            "source": "org/coder",
            "context_window": 4096,
            "pools": ["local"],
        },
    ],
    "fallback": {"source": "./fallback.gguf"},
}


def base() -> dict[str, Any]:
    return copy.deepcopy(BASE)


def load_dict(tmp_path: Path, data: Any) -> ClusterConfig:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, environ={})


def config_error(tmp_path: Path, data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_dict(tmp_path, data)
    return str(caught.value)


# --- good configs -------------------------------------------------------------------------------


def test_embedded_default_loads_every_role_on_the_local_pool() -> None:
    config = load_config(environ={})
    assert [b.name for b in config.backends] == [
        "orchestrator@local",
        "reasoning@local",
        "vision@local",
        "coding@local",
        "embedding@local",
    ]
    assert [b.name for b in config.home_backends] == [b.name for b in config.backends]
    assert config.base_dir == EMBEDDED_CONFIG.parent


def test_embedded_default_serves_roles_alias_and_auto() -> None:
    config = load_config(environ={})
    assert config.served_names == {
        "orchestrator": Role.ORCHESTRATOR,
        "reasoning": Role.REASONING,
        "vision": Role.VISION,
        "coding": Role.CODING,
        "embedding": Role.EMBEDDING,
        "smollm2": Role.ORCHESTRATOR,
        "smollm2-embed": Role.EMBEDDING,
        AUTO_MODEL: None,
    }


def test_embedded_default_has_auth_off() -> None:
    assert load_config(environ={}).api_keys == ()


def test_default_caps_per_role(tmp_path: Path) -> None:
    data = base()
    data["models"] = [
        {"role": role, "source": "org/m", "context_window": 4096, "pools": ["local"]}
        for role in ("orchestrator", "reasoning", "vision", "coding", "embedding")
    ]
    config = load_dict(tmp_path, data)
    caps = {m.role: m.cap for m in config.models}
    assert caps == {
        Role.ORCHESTRATOR: 24,
        Role.REASONING: 8,
        Role.VISION: 4,
        Role.CODING: 6,
        Role.EMBEDDING: 16,
    }


def test_e2e_config_loads_five_roles_an_adapter_and_three_keys() -> None:
    config = load_config(E2E_CONFIG, environ={})
    assert [b.name for b in config.home_backends] == [
        "orchestrator@local",
        "coding@local",
        "vision@local",
        "embedding@local",
        "thinker@local",
        "thinker-small@local",
    ]
    assert set(config.served_names) == {
        "orchestrator",
        "coding",
        "vision",
        "vision-sql",
        "embedding",
        "reasoning",
        "thinker",
        "thinker-small",
        "smollm2",
        "smollm2-coder",
        "smollm2-embed",
        AUTO_MODEL,
    }
    assert config.served_names["smollm2-coder"] == "coding"
    assert config.served_names["reasoning"] == "thinker"
    assert config.base_model("vision-sql").name == "vision"
    key, limited, small = config.api_keys
    assert key.sha256 == hash_key("test-user-key")
    assert (key.priority, key.max_priority) == (PriorityClass.AGENT, PriorityClass.USER)
    assert (key.models, limited.models, small.models) == (
        None,
        ("orchestrator",),
        ("thinker-small",),
    )
    assert config.gateway.max_body_bytes == 2 * 1024 * 1024


def test_model_paths_resolve_against_each_config_file() -> None:
    embedded = load_config(environ={})
    e2e = load_config(E2E_CONFIG, environ={})
    expected = str(REPO_ROOT / ".models" / "SmolLM2-135M-Instruct")
    assert embedded.resolve_path(embedded.models[0].source) == expected
    assert e2e.resolve_path(e2e.models[0].source) == expected


def test_backends_list_every_pool_and_homes_only_the_first(tmp_path: Path) -> None:
    config = load_dict(tmp_path, base())
    assert [b.name for b in config.backends] == [
        "orchestrator@local",
        "orchestrator@cloud",
        "coding@local",
    ]
    assert [b.name for b in config.home_backends] == ["orchestrator@local", "coding@local"]


def test_default_chain_is_each_pool_then_fallback(tmp_path: Path) -> None:
    config = load_dict(tmp_path, base())
    assert config.chain(Role.ORCHESTRATOR) == (
        "orchestrator@local",
        "orchestrator@cloud",
        FALLBACK_BACKEND,
    )
    assert config.chain(Role.CODING) == ("coding@local", FALLBACK_BACKEND)


def test_configured_chain_replaces_the_default(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"orchestrator": ["orchestrator@cloud", "orchestrator@local", "cpu-fallback"]}
    config = load_dict(tmp_path, data)
    assert config.chain(Role.ORCHESTRATOR) == (
        "orchestrator@cloud",
        "orchestrator@local",
        FALLBACK_BACKEND,
    )
    assert config.chain(Role.CODING) == ("coding@local", FALLBACK_BACKEND)


def test_relative_paths_resolve_against_the_config_directory(tmp_path: Path) -> None:
    config = load_dict(tmp_path, base())
    assert config.resolve_path("./models/orc") == str(tmp_path.resolve() / "models" / "orc")
    assert config.resolve_path("../gguf/m.gguf") == str(tmp_path.resolve().parent / "gguf/m.gguf")


def test_absolute_and_home_paths_ignore_the_config_directory(tmp_path: Path) -> None:
    config = load_dict(tmp_path, base())
    assert config.resolve_path("/opt/models/m") == "/opt/models/m"
    assert config.resolve_path("~/m") == str((Path.home() / "m").resolve())


def test_hub_ids_and_model_names_pass_through(tmp_path: Path) -> None:
    config = load_dict(tmp_path, base())
    assert config.resolve_path("org/model") == "org/model"
    assert config.resolve_path("llama3.2:1b") == "llama3.2:1b"


def test_max_concurrency_overrides_the_default_cap(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["max_concurrency"] = 3
    config = load_dict(tmp_path, data)
    assert config.model_for(Role.CODING).cap == 3
    assert config.model_for(Role.ORCHESTRATOR).cap == 24


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_dict(tmp_path, base())
    with pytest.raises(ValidationError, match="frozen"):
        config.base_dir = Path("/elsewhere")  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        config.models[0].max_concurrency = 1  # type: ignore[misc]
    assert config.base_dir == tmp_path.resolve()


# --- API keys from the environment --------------------------------------------------------------


def test_env_keys_are_added_as_hashes_with_their_class() -> None:
    environ = {"GPU_POOL_SERVE_API_KEYS": "sk-first-secret,sk-second-secret:background"}
    config = parse_config(base(), base_dir=Path("."), environ=environ)
    first, second = config.api_keys
    assert first.sha256 == hash_key("sk-first-secret")
    assert (first.priority, first.max_priority) == (PriorityClass.USER, PriorityClass.USER)
    assert second.sha256 == hash_key("sk-second-secret")
    assert (second.priority, second.max_priority) == (
        PriorityClass.BACKGROUND,
        PriorityClass.BACKGROUND,
    )


def test_env_keys_never_appear_in_plain_text() -> None:
    environ = {"GPU_POOL_SERVE_API_KEYS": "sk-first-secret,sk-second-secret:background"}
    dumped = parse_config(base(), base_dir=Path("."), environ=environ).model_dump_json()
    assert hash_key("sk-first-secret") in dumped
    assert "sk-first-secret" not in dumped
    assert "sk-second-secret" not in dumped


def test_env_keys_are_appended_to_file_keys() -> None:
    data = base()
    data["api_keys"] = [{"name": "ops", "sha256": hash_key("ops-key")}]
    environ = {"GPU_POOL_SERVE_API_KEYS": "sk-env"}
    config = parse_config(data, base_dir=Path("."), environ=environ)
    assert [k.sha256 for k in config.api_keys] == [hash_key("ops-key"), hash_key("sk-env")]


def test_blank_env_keys_add_nothing() -> None:
    config = parse_config(base(), base_dir=Path("."), environ={"GPU_POOL_SERVE_API_KEYS": "  "})
    assert config.api_keys == ()


def test_env_key_with_unknown_class_is_a_config_error() -> None:
    environ = {"GPU_POOL_SERVE_API_KEYS": "sk-env:urgent"}
    with pytest.raises(ConfigError) as caught:
        parse_config(base(), base_dir=Path("."), environ=environ)
    message = str(caught.value)
    assert "api_keys.0.priority" in message
    assert "'background'" in message
    assert "sk-env" not in message


# --- bad chains ---------------------------------------------------------------------------------


def test_chain_listing_a_backend_twice_is_refused(tmp_path: Path) -> None:
    data = base()
    loop = ["orchestrator@local", "orchestrator@cloud", "orchestrator@local", "cpu-fallback"]
    data["chains"] = {"orchestrator": loop}
    message = config_error(tmp_path, data)
    assert "chains.orchestrator" in message
    assert "orchestrator@local appears more than once" in message
    assert "list each backend once" in message


def test_chain_not_ending_on_fallback_is_refused(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"orchestrator": ["orchestrator@local", "orchestrator@cloud"]}
    message = config_error(tmp_path, data)
    assert "chains.orchestrator" in message
    assert "must end on 'cpu-fallback'" in message
    assert "append it" in message


def test_empty_chain_is_refused(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"coding": []}
    message = config_error(tmp_path, data)
    assert "chains.coding" in message
    assert "must end on 'cpu-fallback'" in message


def test_fallback_in_the_middle_of_a_chain_is_refused(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"orchestrator": ["cpu-fallback", "orchestrator@local", "cpu-fallback"]}
    message = config_error(tmp_path, data)
    assert "chains.orchestrator" in message
    assert "'cpu-fallback' may only be the last link" in message


def test_chain_link_that_is_not_a_backend_is_refused(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"coding": ["coding@cloud", "cpu-fallback"]}
    message = config_error(tmp_path, data)
    assert "chains.coding" in message
    assert "'coding@cloud' is not a backend" in message
    assert "use model@pool" in message


def test_chain_for_a_role_no_model_serves_is_refused(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"vision": ["cpu-fallback"]}
    message = config_error(tmp_path, data)
    assert "chains.vision" in message
    assert "no model is named 'vision' and no model has that role" in message
    assert "or drop it" in message


def test_chain_for_an_unknown_role_is_refused(tmp_path: Path) -> None:
    data = base()
    data["chains"] = {"visoin": ["cpu-fallback"]}
    message = config_error(tmp_path, data)
    assert "chains.visoin" in message
    assert "no model is named 'visoin'" in message


# --- bad models, aliases and pools --------------------------------------------------------------


def test_model_max_concurrency_zero_is_refused(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["max_concurrency"] = 0
    message = config_error(tmp_path, data)
    assert "models[1].max_concurrency" in message
    assert "must be at least 1" in message


def test_fallback_max_concurrency_zero_is_refused(tmp_path: Path) -> None:
    data = base()
    data["fallback"]["max_concurrency"] = 0
    message = config_error(tmp_path, data)
    assert "fallback.max_concurrency" in message
    assert "must be at least 1" in message


def test_alias_used_by_two_models_is_refused(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["aliases"] = ["orc"]
    message = config_error(tmp_path, data)
    assert "models[1].aliases" in message
    assert "'orc' is already an alias of models[0]" in message
    assert "each alias must name exactly one model" in message


@pytest.mark.parametrize("alias", ["reasoning", "orchestrator", "auto", "cpu-fallback"])
def test_alias_equal_to_a_reserved_name_is_refused(tmp_path: Path, alias: str) -> None:
    data = base()
    data["models"][1]["aliases"] = [alias]
    message = config_error(tmp_path, data)
    assert "models[1].aliases" in message
    assert f"{alias!r} is a model's or role's name (or reserved); pick another" in message


def test_model_on_an_unknown_pool_is_refused(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["pools"] = ["mars"]
    message = config_error(tmp_path, data)
    assert "models[1].pools" in message
    assert "pool 'mars' does not exist" in message
    assert "['cloud', 'local']" in message


def test_model_listing_a_pool_twice_is_refused(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["pools"] = ["local", "local"]
    message = config_error(tmp_path, data)
    assert "models[1].pools" in message
    assert "listed twice" in message


def test_fallback_on_an_unknown_pool_is_refused(tmp_path: Path) -> None:
    data = base()
    data["fallback"]["pool"] = "mars"
    message = config_error(tmp_path, data)
    assert "fallback.pool" in message
    assert "pool 'mars' does not exist" in message
    assert "leave fallback.pool empty" in message


def test_two_models_with_one_name_are_refused(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["role"] = "orchestrator"  # unnamed: both are named by their role
    message = config_error(tmp_path, data)
    assert "two models are named 'orchestrator'" in message
    assert "give each its own name (models[].name)" in message


def test_duplicate_pool_names_are_refused(tmp_path: Path) -> None:
    data = base()
    data["pools"].append({"name": "local", "kind": "mesh"})
    message = config_error(tmp_path, data)
    assert "pools: pool 'local' is defined twice" in message
    assert "give each pool its own name" in message


def test_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    data = base()
    data["modles"] = data.pop("models")
    message = config_error(tmp_path, data)
    assert "modles: is not a known key; check its spelling" in message
    assert "models: Field required" in message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = base()
    data["models"][1]["max_concurrency"] = 0
    data["fallback"]["pool"] = "mars"
    message = config_error(tmp_path, data)
    assert "models[1].max_concurrency" in message
    assert "fallback.pool" in message


# --- bad placement and keys ---------------------------------------------------------------------


@pytest.mark.parametrize("restore", [8.0, 4.0])
def test_restore_threshold_not_above_offload_is_refused(tmp_path: Path, restore: float) -> None:
    data = base()
    data["placement"] = {"offload_below_gb": 8.0, "restore_above_gb": restore}
    message = config_error(tmp_path, data)
    assert "placement" in message
    assert "restore_above_gb" in message
    assert "must be greater than offload_below_gb (8.0)" in message


def test_class_shares_default_and_merge_with_what_is_given(tmp_path: Path) -> None:
    data = base()
    data["router"] = {"class_shares": {"background": 0.25}}
    shares = load_dict(tmp_path, data).router.class_shares
    assert shares == {
        PriorityClass.USER: 1.0,
        PriorityClass.AGENT: 0.75,
        PriorityClass.BACKGROUND: 0.25,
    }


@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        ({"user": 0.8}, "class_shares.user must be 1.0"),
        ({"agent": 0.5, "background": 0.7}, "must not grow down the classes"),
        ({"background": 0}, "greater than 0"),
    ],
)
def test_bad_class_shares_are_refused(
    tmp_path: Path, shares: dict[str, float], expected: str
) -> None:
    data = base()
    data["router"] = {"class_shares": shares}
    message = config_error(tmp_path, data)
    assert "router" in message
    assert expected in message


def test_engine_priorities_number_the_classes_in_order_and_merge_with_what_is_given(
    tmp_path: Path,
) -> None:
    data = base()
    data["router"] = {"engine_priorities": {"background": 10}}
    router = load_dict(tmp_path, data).router
    numbers = [router.engine_priority_of(c) for c in PriorityClass]
    assert numbers == [0, 1, 10]
    data["router"]["engine_priority"] = False
    off = load_dict(tmp_path, data).router
    assert [off.engine_priority_of(c) for c in PriorityClass] == [0, 0, 0]


def test_engine_priorities_that_would_run_background_before_users_are_refused(
    tmp_path: Path,
) -> None:
    data = base()
    data["router"] = {"engine_priorities": {"user": 5}}
    message = config_error(tmp_path, data)
    assert "engine_priorities must not fall down the classes" in message


def test_key_priority_above_its_cap_is_refused(tmp_path: Path) -> None:
    data = base()
    data["api_keys"] = [
        {"name": "bot", "sha256": hash_key("x"), "priority": "user", "max_priority": "agent"}
    ]
    message = config_error(tmp_path, data)
    assert "api_keys.0" in message
    assert "priority 'user' is above max_priority 'agent'" in message
    assert "lower priority or raise max_priority" in message


@pytest.mark.parametrize("digest", ["abc123", "A" * 64, "g" * 64, "a" * 65])
def test_malformed_sha256_is_refused(tmp_path: Path, digest: str) -> None:
    data = base()
    data["api_keys"] = [{"name": "bot", "sha256": digest}]
    message = config_error(tmp_path, data)
    assert "api_keys.0.sha256" in message
    assert "64-hex-digit SHA-256" in message
    assert "python -m cluster.keys hash" in message


def test_same_key_listed_twice_is_refused(tmp_path: Path) -> None:
    data = base()
    data["api_keys"] = [
        {"name": "one", "sha256": hash_key("same")},
        {"name": "two", "sha256": hash_key("same")},
    ]
    message = config_error(tmp_path, data)
    assert "the same key is listed twice" in message


def test_key_name_used_twice_is_refused(tmp_path: Path) -> None:
    data = base()
    data["api_keys"] = [
        {"name": "bot", "sha256": hash_key("one")},
        {"name": "bot", "sha256": hash_key("two")},
    ]
    message = config_error(tmp_path, data)
    assert "key name 'bot' is used twice" in message


# --- bad files ----------------------------------------------------------------------------------


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("pools: [local\nmodels: {\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert str(path) in message
    assert "is not valid YAML" in message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert f"cannot read {path}" in message
    assert "No such file" in message


def test_top_level_list_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump([base()]))
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert f"invalid config {path}" in message
    assert "must hold a mapping" in message


def test_bad_config_message_names_the_file(tmp_path: Path) -> None:
    data = base()
    data["fallback"]["max_concurrency"] = 0
    message = config_error(tmp_path, data)
    assert message.startswith(f"invalid config {tmp_path / 'cluster.yaml'}")


# --- the CPU fallback ---------------------------------------------------------------------------


def test_the_fallback_is_a_target_with_its_own_window_cap_and_tokenizer(tmp_path: Path) -> None:
    data = base()
    data["fallback"] = {"source": "./fallback.gguf", "context_window": 1024, "max_concurrency": 3}
    config = load_dict(tmp_path, data)
    target = config.targets[FALLBACK_BACKEND]
    assert (target.context_window, target.cap, target.replicas) == (1024, 3, 1)
    assert (target.role, target.model_id) == (None, FALLBACK_BACKEND)
    assert target.tokenizer == str(tmp_path / "fallback.gguf")  # the GGUF's own tokenizer
    assert config.home_targets[-1] == target
    coding = config.targets["coding@local"]
    assert (coding.context_window, coding.cap, coding.model_id) == (4096, 6, "coding")


def test_a_fallback_tokenizer_can_be_named(tmp_path: Path) -> None:
    data = base()
    data["fallback"] = {"source": "llama3.2:1b", "engine": "ollama", "tokenizer": "./tok"}
    config = load_dict(tmp_path, data)
    assert config.fallback_source == "llama3.2:1b"
    assert config.targets[FALLBACK_BACKEND].tokenizer == str(tmp_path / "tok")


@pytest.mark.parametrize("engine", ["llama_cpp", "llama_server"])
def test_llama_cpp_with_an_ollama_model_name_is_refused(tmp_path: Path, engine: str) -> None:
    data = base()
    data["fallback"] = {"source": "llama3.2:1b", "engine": engine}
    message = config_error(tmp_path, data)
    assert "fallback" in message
    assert f"the {engine} engine serves a GGUF file" in message


def test_a_malformed_keep_alive_is_refused(tmp_path: Path) -> None:
    data = base()
    data["fallback"]["keep_alive"] = "forever"
    assert "fallback.keep_alive" in config_error(tmp_path, data)


def test_provisioner_shorthand_and_full_form() -> None:
    from core.config import CommandProvisioner, RayAutoscalerProvisioner

    config = load_config(None)
    pools = [
        {"name": "local", "kind": "local"},
        {"name": "cloud", "kind": "cloud", "provisioner": "ray_autoscaler"},
        {
            "name": "mesh",
            "kind": "mesh",
            "provisioner": {"type": "command", "command": ["./join.sh", "--fast"]},
        },
    ]
    raw = config.model_dump(mode="json", exclude={"base_dir"})
    parsed = type(config).model_validate({**raw, "pools": pools, "base_dir": config.base_dir})
    assert isinstance(parsed.pool("cloud").provisioner, RayAutoscalerProvisioner)
    mesh = parsed.pool("mesh").provisioner
    assert isinstance(mesh, CommandProvisioner)
    assert mesh.command == ("./join.sh", "--fast")
    assert parsed.pool("local").provisioner.type == "none"


def test_unknown_provisioner_type_is_refused() -> None:
    config = load_config(None)
    raw = config.model_dump(mode="json", exclude={"base_dir"})
    pools = [{"name": "local", "kind": "local", "provisioner": "kubernetes"}]
    with pytest.raises(ValueError, match="provisioner"):
        type(config).model_validate({**raw, "pools": pools})


def test_gateway_may_not_stand_on_a_pool() -> None:
    config = load_config(None)
    raw = config.model_dump(mode="json", exclude={"base_dir"})
    with pytest.raises(ValueError, match=r"gateway\.resource"):
        type(config).model_validate({**raw, "gateway": {"resource": "pool_local"}})


def test_the_digest_of_a_well_known_password_is_refused(tmp_path: Path) -> None:
    data = base()
    data["api_keys"] = [{"name": "ide", "sha256": hash_key("password")}]
    message = config_error(tmp_path, data)
    assert "'ide' is the digest of a well-known password" in message
    assert "cluster.keys new" in message


def test_key_limits_are_read_and_checked(tmp_path: Path) -> None:
    data = base()
    key = {"name": "ide", "sha256": hash_key("ide-key"), "rpm": 5, "tpm": 1000}
    data["api_keys"] = [{**key, "budget_tokens": 10, "budget_period": "week", "admin": True}]
    [loaded] = load_dict(tmp_path, data).api_keys
    assert (loaded.rpm, loaded.tpm, loaded.budget_period, loaded.admin) == (5, 1000, "week", True)
    data["api_keys"] = [{**key, "rpm": 0}]
    assert "api_keys.0.rpm" in config_error(tmp_path, data)
    data["api_keys"] = [{**key, "budget_period": "year"}]
    assert "api_keys.0.budget_period" in config_error(tmp_path, data)


def test_example_configs_carry_no_guessable_key() -> None:
    for example in (Path(__file__).parents[2] / "ray_configs").glob("*.yaml"):
        text = example.read_text()
        assert hash_key("password") not in text, example


def test_a_router_in_each_ingress_splits_caps_by_ingress_replicas(tmp_path: Path) -> None:
    data = base()
    data["gateway"] = {"router_in_ingress": True, "ingress_replicas": 4, "router_replicas": 1}
    data["models"][1]["max_concurrency"] = 3
    message = config_error(tmp_path, data)
    assert "models[1].max_concurrency (3) must be at least gateway.ingress_replicas (4)" in message
    data["models"][1]["max_concurrency"] = 8
    data["gateway"]["router_in_ingress"] = False  # a router deployment of one: no split
    assert load_dict(tmp_path, data).gateway.router_shares == 1


def test_overrides_are_laid_over_the_file_mapping_by_mapping() -> None:
    """A Serve config's app args adapt a shared file to one cluster (deploy/kuberay)."""
    overrides = {
        "gateway": {"resource": "gateway", "proxy_location": "EveryNode"},
        "batches": {"directory": "/var/lib/gps/batches"},
        "chains": {"coding": ["coding@local", "cpu-fallback"]},
    }
    base = load_config(None, environ={})
    config = load_config(None, environ={}, overrides=overrides)
    assert (config.gateway.resource, config.gateway.proxy_location) == ("gateway", "EveryNode")
    assert config.gateway.max_body_bytes == base.gateway.max_body_bytes  # merged, not replaced
    assert config.batches.directory == Path("/var/lib/gps/batches")
    assert config.chains["coding"] == ("coding@local", "cpu-fallback")  # a list replaces
    assert config.models == base.models


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ("gateway.resource=gateway", "a mapping of config keys"),
        ({"gateway": {"proxy_location": "Everywhere"}}, r"(?s)overrides:.*gateway\.proxy_location"),
    ],
)
def test_overrides_that_are_not_a_config_are_refused(overrides: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(None, environ={}, overrides=overrides)
