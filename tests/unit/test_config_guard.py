"""The config guard: each refusal and warning from its arithmetic, on real model files written
here (config.json and a weights file of the right size), through `python -m cluster.config`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import config as config_cli
from cluster.model_files import read_geometry
from core.config import load_config
from policy.config_guard import Finding, guard_config
from policy.engine_memory import ModelGeometry, geometry_from_hf_config

GiB = 1 << 30
# SmolLM2-135M-Instruct's config.json, as the demo model's preparation writes it.
DEMO_HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "dtype": "float32",
    "head_dim": 64,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
}
DEMO_WEIGHTS = 538_090_408  # float32 on disk
DEMO_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # K and V, layers, KV heads, head_dim, bfloat16


def write_model(folder: Path, hf_config: dict[str, Any], weight_bytes: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(hf_config))
    with open(folder / "model.safetensors", "wb") as weights:
        weights.truncate(weight_bytes)  # sparse: the size is what the guard reads
    return folder


def cpu_model(**overrides: Any) -> dict[str, Any]:
    return {
        "role": "orchestrator",
        "source": "./model",
        "context_window": 8192,
        "device": "cpu",
        "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "engine_kwargs": {"dtype": "bfloat16"},
        "cpu_dtype": "as_configured",  # bfloat16 on every node: the arithmetic below
        "max_concurrency": 4,
        "pools": ["local"],
        **overrides,
    }


def config_file(
    tmp_path: Path, *models: dict[str, Any], gpu_memory_gb: float | None = None
) -> Path:
    pool: dict[str, Any] = {"name": "local", "kind": "local"}
    if gpu_memory_gb is not None:
        pool["gpu_memory_gb"] = gpu_memory_gb
    path = tmp_path / "cluster.yaml"
    data = {"pools": [pool], "models": list(models), "fallback": {"source": "./f.gguf"}}
    path.write_text(yaml.safe_dump(data))
    return path


def findings(tmp_path: Path, *models: dict[str, Any], **pool: Any) -> list[Finding]:
    return config_cli.check(load_config(config_file(tmp_path, *models, **pool), environ={}))


def only(found: list[Finding], level: str) -> list[Finding]:
    return [f for f in found if f.level == level]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return write_model(tmp_path / "model", DEMO_HF_CONFIG, DEMO_WEIGHTS)


def test_kv_bytes_per_token_from_the_models_geometry(demo: Path) -> None:
    geometry = read_geometry(str(demo))
    assert isinstance(geometry, ModelGeometry)
    assert geometry.kv_bytes_per_token(2) == DEMO_KV_BYTES_PER_TOKEN == 23040
    assert geometry.max_positions == 8192


def test_the_demo_model_within_its_cache_passes_with_its_arithmetic(
    tmp_path: Path, demo: Path
) -> None:
    assert only(findings(tmp_path, cpu_model()), "refuse") == []
    assert only(findings(tmp_path, cpu_model()), "warn") == []
    [line] = config_cli.summary(load_config(config_file(tmp_path, cpu_model()), environ={}))
    # 1 GiB / 23040 B = 46603 tokens, 364 whole blocks of 128, less vLLM's null block: 46464;
    # weights in bfloat16: half.
    assert "KV cache 46464 tokens = 5 full windows of 8192" in line
    assert "weights 0.25 GiB" in line


def test_a_cpu_engine_whose_node_may_lack_bf16_math_is_reckoned_in_float32(
    tmp_path: Path, demo: Path
) -> None:
    model = cpu_model(cpu_dtype="auto")
    [line] = config_cli.summary(load_config(config_file(tmp_path, model), environ={}))
    # 1 GiB / 46080 B = 23301 tokens, 182 whole blocks of 128, less vLLM's null block: 23168;
    # weights in float32, as the checkpoint stores them.
    assert "46080 KV bytes/token, KV cache 23168 tokens = 2 full windows of 8192" in line
    assert "weights 0.50 GiB" in line
    [warned] = only(findings(tmp_path, model), "warn")
    assert "2 sequences of the full 8192-token window" in warned.message


def test_a_window_above_the_models_own_maximum_is_refused(tmp_path: Path, demo: Path) -> None:
    [refused] = only(findings(tmp_path, cpu_model(context_window=16384)), "refuse")
    assert refused.where == "models[0].context_window"
    assert "maximum position (8192" in refused.message


def test_yarn_scaling_stretches_the_models_window() -> None:
    scaled = {**DEMO_HF_CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    assert geometry_from_hf_config(scaled, 1).max_positions == 32768


def test_a_cache_that_cannot_hold_one_window_is_refused_with_the_tokens_it_holds(
    tmp_path: Path, demo: Path
) -> None:
    small = cpu_model(engine_kwargs={"dtype": "bfloat16", "num_gpu_blocks_override": 16})
    [refused] = only(findings(tmp_path, small), "refuse")
    assert refused.where == "models[0].context_window"
    # 16 blocks of 128, one of them vLLM's null block
    assert "= 1920 tokens in whole blocks of 128, less the one vLLM holds back" in refused.message
    assert "Lower context_window to 1920" in refused.message


def test_a_cap_above_what_the_cache_holds_at_full_window_is_a_warning_with_the_fix(
    tmp_path: Path, demo: Path
) -> None:
    [warned] = only(findings(tmp_path, cpu_model(max_concurrency=24)), "warn")
    assert warned.where == "models[0].max_concurrency"
    assert "5 sequences of the full 8192-token window" in warned.message
    assert "max_concurrency 5 rules that out" in warned.message
    spread = cpu_model(max_concurrency=10, replicas=2)  # 5 per replica: fits
    assert only(findings(tmp_path, spread), "warn") == []


def test_a_cap_above_the_engines_max_num_seqs_is_a_warning(tmp_path: Path, demo: Path) -> None:
    short = cpu_model(context_window=512, engine_kwargs={"dtype": "bfloat16", "max_num_seqs": 2})
    [warned] = only(findings(tmp_path, short), "warn")
    assert "runs 2 at once (engine_kwargs.max_num_seqs)" in warned.message


def test_an_fp8_kv_cache_halves_the_bytes_per_token(tmp_path: Path, demo: Path) -> None:
    fp8 = cpu_model(
        engine_kwargs={"dtype": "bfloat16", "kv_cache_dtype": "fp8"}, max_concurrency=10
    )
    assert only(findings(tmp_path, fp8), "warn") == []  # 93184 tokens: 11 full windows
    [line] = config_cli.summary(load_config(config_file(tmp_path, fp8), environ={}))
    assert "11520 KV bytes/token" in line


def gpu_model(**kwargs: Any) -> dict[str, Any]:
    return {
        "role": "orchestrator",
        "source": "./model",
        "context_window": 8192,
        "engine_kwargs": kwargs,
        "max_concurrency": 4,
        "pools": ["local"],
    }


def test_gpu_memory_utilization_above_095_is_refused(tmp_path: Path, demo: Path) -> None:
    [refused] = only(findings(tmp_path, gpu_model(gpu_memory_utilization=0.97)), "refuse")
    assert refused.where == "models[0].engine_kwargs.gpu_memory_utilization"
    assert "0.95 or less" in refused.message


def test_a_cpu_block_size_its_attention_cannot_take_is_refused(tmp_path: Path, demo: Path) -> None:
    kwargs = {"dtype": "bfloat16", "block_size": 16}
    [refused] = only(findings(tmp_path, cpu_model(engine_kwargs=kwargs)), "refuse")
    assert refused.where == "models[0].engine_kwargs.block_size"
    assert "not a multiple of 32" in refused.message
    assert refused.message.endswith("use 32")
    kwargs = {"dtype": "bfloat16", "block_size": 64}
    assert only(findings(tmp_path, cpu_model(engine_kwargs=kwargs)), "refuse") == []


def test_weights_larger_than_the_gpu_share_are_refused_and_fp8_makes_them_fit(
    tmp_path: Path,
) -> None:
    # 16 GiB of bfloat16 weights on an 16 GiB GPU at 0.9: 14.4 GiB usable.
    write_model(tmp_path / "model", {**DEMO_HF_CONFIG, "dtype": "bfloat16"}, 16 * GiB)
    [refused] = only(
        findings(tmp_path, gpu_model(gpu_memory_utilization=0.9), gpu_memory_gb=16), "refuse"
    )
    assert "weights (16.00 GiB) do not fit the 14.40 GiB" in refused.message
    fp8 = gpu_model(gpu_memory_utilization=0.9, quantization="fp8")
    assert only(findings(tmp_path, fp8, gpu_memory_gb=16), "refuse") == []


def test_a_gpu_pool_of_unknown_size_is_a_note_not_a_refusal(tmp_path: Path, demo: Path) -> None:
    found = findings(tmp_path, gpu_model())
    assert only(found, "refuse") == []
    assert any("gpu_memory_gb" in f.message for f in only(found, "note"))


def test_awq_on_weights_that_are_not_awq_is_refused(tmp_path: Path, demo: Path) -> None:
    [refused] = only(findings(tmp_path, gpu_model(quantization="awq")), "refuse")
    assert refused.where == "models[0].engine_kwargs.quantization"
    assert "not quantized" in refused.message


def test_prefix_caching_on_an_embedding_model_is_a_warning(tmp_path: Path, demo: Path) -> None:
    embed = cpu_model(
        role="embedding",
        context_window=2048,
        engine_kwargs={"dtype": "bfloat16", "enable_prefix_caching": True},
    )
    [warned] = only(findings(tmp_path, embed), "warn")
    assert warned.where == "models[0].engine_kwargs.enable_prefix_caching"


def test_a_model_not_on_this_machine_is_a_note(tmp_path: Path) -> None:
    [note] = findings(tmp_path, cpu_model(source="nobody/nothing-here"))
    assert note.level == "note"
    assert "not checked" in note.message


def test_the_embedded_default_passes_its_own_guard() -> None:
    """Every model of the embedded config is the demo model."""
    embedded = load_config(environ={})
    demo = geometry_from_hf_config(DEMO_HF_CONFIG, DEMO_WEIGHTS)
    found = guard_config(embedded, dict.fromkeys(range(len(embedded.models)), demo))
    assert [f for f in found if f.level != "note"] == []


def test_the_command_exits_1_on_a_refusal_and_0_otherwise(
    tmp_path: Path, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = config_file(tmp_path, cpu_model())
    assert config_cli.main(["check", str(ok)]) == 0
    assert "OK: 0 refused" in capsys.readouterr().out
    refused = config_file(tmp_path, cpu_model(context_window=16384))
    assert config_cli.main(["check", str(refused)]) == 1
    assert "REFUSED: 1 refused" in capsys.readouterr().out
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"pools": []}))
    assert config_cli.main(["check", str(broken)]) == 2


def test_serve_run_refuses_a_guarded_config_before_starting_ray(
    tmp_path: Path, demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster import app

    # Whether Ray runs in this process depends on the tests before; whether build asked for it
    # does not.
    started: list[object] = []
    monkeypatch.setattr(app, "ensure_ray", started.append)
    refused = config_file(tmp_path, cpu_model(context_window=16384))
    with pytest.raises(SystemExit) as exited:
        app.build({"config": str(refused)})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "REFUSE models[0].context_window" in err
    assert "nothing was started" in err
    assert started == []
