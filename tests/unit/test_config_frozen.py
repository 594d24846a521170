"""The validated config stays as validated: read-only mappings that still pickle for Ray."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from core.config import API_KEYS_ENV, ConfigError, hash_key, load_config, parse_config
from core.errors import ApiError
from core.types import Role

GPU_EXAMPLE = Path(__file__).parents[2] / "ray_configs" / "gpu.example.yaml"


def test_mappings_inside_the_config_refuse_changes() -> None:
    config = load_config(GPU_EXAMPLE, environ={})
    with pytest.raises(TypeError, match="read-only"):
        config.chains[Role.CODING] = ("nonsense",)
    with pytest.raises(TypeError, match="read-only"):
        config.models[0].engine_kwargs.update(max_model_len=1)
    assert config.chain(Role.CODING)[-1] == "cpu-fallback"


def test_config_survives_pickling_for_ray() -> None:
    config = load_config(GPU_EXAMPLE, environ={})
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config
    with pytest.raises(TypeError, match="read-only"):
        copy.chains[Role.VISION] = ()


def test_gpu_example_derives_backends_on_three_pools() -> None:
    config = load_config(GPU_EXAMPLE, environ={})
    assert {b.pool for b in config.backends} == {"local", "mesh", "cloud"}
    assert config.chain("reasoning") == (
        "reasoning@cloud",
        "reasoning@local",
        "orchestrator@local",
        "cpu-fallback",
    )
    assert config.served_names["qwen2.5-7b"] == "orchestrator"


def test_env_key_containing_a_colon_takes_an_explicit_class() -> None:
    data = load_config(GPU_EXAMPLE, environ={}).model_dump(mode="json", exclude={"base_dir"})
    environ = {API_KEYS_ENV: "tenant:abc:agent"}
    config = parse_config(data, base_dir=Path("."), environ=environ)
    added = config.api_keys[-1]
    assert added.sha256 == hash_key("tenant:abc")
    assert added.max_priority.value == "agent"


def test_env_key_that_is_empty_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty key"):
        load_config(GPU_EXAMPLE, environ={API_KEYS_ENV: ":agent"})


def test_all_digit_digest_must_be_quoted(tmp_path: Path) -> None:
    text = GPU_EXAMPLE.read_text().replace(
        "api_keys: []", f"api_keys:\n  - name: ide\n    sha256: {'1' * 64}"
    )
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match="quote the digest"):
        load_config(tmp_path / "c.yaml", environ={})


def test_api_error_pickles_with_every_field() -> None:
    error = pickle.loads(pickle.dumps(ApiError(429, "shed", "busy", headers={"Retry-After": "2"})))
    assert (error.status, error.code, error.message) == (429, "shed", "busy")
    assert error.headers["Retry-After"] == "2"


def test_max_model_len_in_engine_kwargs_points_to_context_window(tmp_path: Path) -> None:
    text = GPU_EXAMPLE.read_text().replace(
        "      gpu_memory_utilization: 0.85\n",
        "      gpu_memory_utilization: 0.85\n      max_model_len: 4096\n",
    )
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"engine_kwargs.max_model_len: set context_window"):
        load_config(tmp_path / "c.yaml", environ={})


def test_null_api_keys_with_env_keys(tmp_path: Path) -> None:
    text = GPU_EXAMPLE.read_text().split("api_keys:")[0] + "api_keys:\n"
    (tmp_path / "c.yaml").write_text(text)
    config = load_config(tmp_path / "c.yaml", environ={API_KEYS_ENV: "k1"})
    assert [k.sha256 for k in config.api_keys] == [hash_key("k1")]
