"""The window vLLM's engine processes spin in for their next step (deployments/engine/shm_spin.py):
read from the replica's environment, set on vLLM's SpinCondition when its module is imported,
2 ms for CPU engines unless a model's env_vars say otherwise, refused by the config if it is
not seconds."""

from __future__ import annotations

import importlib
import sys
import types
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.backends import llm_config_for
from core.config import ClusterConfig, parse_config
from core.config.base import ConfigError
from core.config.serving import SHM_SPIN_ENV
from core.topology import Backend
from deployments.engine import shm_spin

E2E = Path(__file__).parents[1] / "e2e"


def vllm_like_module(name: str) -> types.ModuleType:
    """A module shaped as vLLM 0.32's shm_broadcast where it matters here."""

    class SpinCondition:
        def __init__(
            self, is_reader: bool, context: object, notify_address: str, busy_loop_s: float = 1
        ) -> None:
            self.busy_loop_s = busy_loop_s

    module = types.ModuleType(name)
    module.SpinCondition = SpinCondition  # type: ignore[attr-defined]
    return module


def test_the_name_is_one_in_the_config_and_the_hook() -> None:
    assert SHM_SPIN_ENV == shm_spin.ENV == "GPS_ENGINE_SHM_SPIN_S"


@pytest.mark.parametrize("value", ["0", "0.002", "1", "2.5"])
def test_a_window_is_seconds(value: str) -> None:
    assert shm_spin.window_s(value) == float(value)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "", "2ms"])
def test_what_is_not_a_window_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=shm_spin.ENV):
        shm_spin.window_s(value)


def test_set_window_changes_the_default_and_an_explicit_value_still_wins() -> None:
    module = vllm_like_module("fake_shm_broadcast")
    assert shm_spin.set_window(module, 0.002)
    assert module.SpinCondition(True, None, "ipc://x").busy_loop_s == 0.002
    assert module.SpinCondition(True, None, "ipc://x", busy_loop_s=3).busy_loop_s == 3


def test_another_vllm_without_the_parameter_is_left_as_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = types.ModuleType("other_shm_broadcast")

    class SpinCondition:
        def __init__(self, is_reader: bool, spin_s: float = 1) -> None:
            self.spin_s = spin_s

    module.SpinCondition = SpinCondition  # type: ignore[attr-defined]
    assert not shm_spin.set_window(module, 0.002)
    assert SpinCondition(True).spin_s == 1
    assert "has no SpinCondition(busy_loop_s=...)" in capsys.readouterr().err
    assert not shm_spin.set_window(types.ModuleType("no_class"), 0.002)


def test_the_environment_sets_it_when_the_module_is_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = f"fake_vllm_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "class SpinCondition:\n"
        "    def __init__(self, is_reader, context, notify_address, busy_loop_s=1):\n"
        "        self.busy_loop_s = busy_loop_s\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(shm_spin, "MODULE", name)
    assert shm_spin.apply_from_env({shm_spin.ENV: "0.002"}) == 0.002
    module = importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name)
    assert module.SpinCondition(True, None, "ipc://x").busy_loop_s == 0.002


def test_a_hook_that_fails_leaves_vllms_import_and_window_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"fake_vllm_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "def __getattr__(name):\n    raise RuntimeError('not the vLLM we know')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(shm_spin, "MODULE", name)
    shm_spin.apply_from_env({shm_spin.ENV: "0.002"})
    assert importlib.import_module(name).__name__ == name  # the import, and the engine, go on
    monkeypatch.delitem(sys.modules, name)
    assert "not the vLLM we know" in capsys.readouterr().err


def test_without_the_variable_or_with_a_bad_one_vllms_window_stays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert shm_spin.apply_from_env({}) is None
    assert shm_spin.apply_from_env({shm_spin.ENV: "soon"}) is None
    assert "vLLM's own window stays" in capsys.readouterr().err


def gateway_config(env_vars: dict[str, str] | None = None) -> ClusterConfig:
    raw: dict[str, Any] = yaml.safe_load((E2E / "gateway.yaml").read_text())
    [coding] = [m for m in raw["models"] if m.get("role") == "coding"]
    if env_vars is not None:
        coding["env_vars"] = {**coding["env_vars"], **env_vars}
    return parse_config(raw, base_dir=E2E, environ={})


def replica_env(config: ClusterConfig) -> Mapping[str, str]:
    built = llm_config_for(config, Backend(model="coding", pool="local"))
    env: Mapping[str, str] = built.runtime_env["env_vars"]
    return env


def test_a_cpu_engines_replica_gets_2_ms_and_a_models_own_value_wins() -> None:
    assert replica_env(gateway_config())[shm_spin.ENV] == shm_spin.CPU_ENGINE_S == "0.002"
    assert replica_env(gateway_config({shm_spin.ENV: "1"}))[shm_spin.ENV] == "1"


def test_a_gpu_engines_replica_keeps_vllms_window() -> None:
    config = gateway_config()
    coding = config.base_model("coding").model_copy(update={"device": "gpu"})
    gpu = config.model_copy(
        update={"models": tuple(coding if m.name == "coding" else m for m in config.models)}
    )
    assert shm_spin.ENV not in replica_env(gpu)


@pytest.mark.parametrize("value", ["-0.5", "never", "nan"])
def test_the_config_refuses_a_window_that_is_not_seconds(value: str) -> None:
    with pytest.raises(ConfigError, match=SHM_SPIN_ENV):
        gateway_config({SHM_SPIN_ENV: value})
