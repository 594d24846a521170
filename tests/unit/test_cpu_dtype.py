"""A CPU engine's dtype by its node's CPU (policy/cpu_dtype.py): float32 where vLLM would
emulate 16-bit math, as configured elsewhere; the replica applies it on its node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.backends import llm_config_for
from core.config import parse_config
from core.topology import Backend
from deployments.engine import llm_server
from deployments.engine.cpu_features import cpu_flags, node_has_native_bf16
from policy.cpu_dtype import (
    CPU_DTYPE_ENV,
    configured_dtype,
    cpu_serving_dtype,
    has_native_bf16,
    served_model,
)

E2E = Path(__file__).parents[1] / "e2e"
AVX2_FLAGS = "fpu sse4_2 avx f16c fma avx2"
SAPPHIRE_RAPIDS_FLAGS = f"{AVX2_FLAGS} avx512f avx512_bf16 amx_bf16 amx_tile"


@pytest.mark.parametrize("configured", ["bfloat16", "float16", "half", "auto"])
def test_a_16_bit_dtype_runs_in_float32_on_a_cpu_without_bf16_math(configured: str) -> None:
    assert cpu_serving_dtype(configured, "auto", native_bf16=False) == "float32"
    assert cpu_serving_dtype(configured, "auto", native_bf16=True) == configured
    assert cpu_serving_dtype(configured, "as_configured", native_bf16=False) == configured


def test_a_dtype_that_is_not_16_bit_is_left_alone() -> None:
    assert cpu_serving_dtype("float32", "auto", native_bf16=False) == "float32"


def test_only_an_x86_cpu_with_avx512_bf16_or_amx_counts_as_native() -> None:
    assert not has_native_bf16("x86_64", AVX2_FLAGS.split())
    assert not has_native_bf16("x86_64", [*AVX2_FLAGS.split(), "avx512f", "avx512bw"])
    assert has_native_bf16("x86_64", ["avx512_bf16"])
    assert has_native_bf16("x86_64", ["amx_bf16"])
    assert has_native_bf16("aarch64", [])  # vLLM's ARM build has bf16 kernels of its own


def test_the_flags_come_from_cpuinfo_and_an_unreadable_one_means_none(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\nflags\t\t: {SAPPHIRE_RAPIDS_FLAGS}\n\n"
        f"processor\t: 1\nflags\t\t: {SAPPHIRE_RAPIDS_FLAGS}\n"
    )
    assert "amx_bf16" in cpu_flags(cpuinfo)
    assert node_has_native_bf16(cpuinfo, machine="x86_64")
    assert cpu_flags(tmp_path / "absent") == frozenset()
    assert not node_has_native_bf16(tmp_path / "absent", machine="x86_64")


def test_a_missing_dtype_is_vllms_auto() -> None:
    assert configured_dtype({"enforce_eager": True}) == "auto"
    assert cpu_serving_dtype(configured_dtype({}), "auto", native_bf16=False) == "float32"


def gateway_config(**changes: Any) -> Any:
    raw: dict[str, Any] = yaml.safe_load((E2E / "gateway.yaml").read_text())
    [coding] = [m for m in raw["models"] if m.get("role") == "coding"]
    coding.update(changes)
    return parse_config(raw, base_dir=E2E, environ={})


def test_a_served_model_is_a_cpu_models_copy_and_a_gpu_model_as_it_is() -> None:
    config = gateway_config(cpu_dtype="auto")
    coding = config.base_model("coding")
    served = served_model(coding, native_bf16=False)
    assert served.engine_kwargs == {**coding.engine_kwargs, "dtype": "float32"}
    assert coding.engine_kwargs["dtype"] == "bfloat16"
    assert served_model(coding, native_bf16=True) is coding
    gpu = coding.model_copy(update={"device": "gpu"})
    assert served_model(gpu, native_bf16=False) is gpu


def engine_dtype(built: Any) -> Any:
    """The dtype the replica's engine starts with: ray.serve.llm's engine config (cached when
    the deployment is built), as its VLLMEngine reads it."""
    return built.get_engine_config().get_initialization_kwargs()["dtype"]


@pytest.mark.parametrize(("choice", "native", "expected"), [
    ("auto", False, "float32"),
    ("auto", True, "bfloat16"),
    ("as_configured", False, "bfloat16"),
])  # fmt: skip
def test_a_cpu_backend_tells_its_replica_the_choice_and_its_engine_starts_with_it(
    monkeypatch: pytest.MonkeyPatch, choice: str, native: bool, expected: str
) -> None:
    built = llm_config_for(gateway_config(cpu_dtype=choice), Backend(model="coding", pool="local"))
    assert built.runtime_env["env_vars"][CPU_DTYPE_ENV] == choice
    assert engine_dtype(built) == "bfloat16"  # cached, as the deployment's build caches it
    monkeypatch.setenv(CPU_DTYPE_ENV, choice)
    monkeypatch.setattr(llm_server, "node_has_native_bf16", lambda: native)
    served = llm_server.served_on_this_node(built)
    assert engine_dtype(served) == expected
    assert served.engine_kwargs["dtype"] == expected


def test_a_replica_not_told_keeps_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    built = llm_config_for(gateway_config(), Backend(model="coding", pool="local"))
    monkeypatch.delenv(CPU_DTYPE_ENV, raising=False)
    monkeypatch.setattr(llm_server, "node_has_native_bf16", lambda: False)
    assert engine_dtype(llm_server.served_on_this_node(built)) == "bfloat16"
