"""A real LoRA adapter for the demo model (or the demo vision model's language model), made at
test time: PEFT's files (adapter_config.json and adapter_model.safetensors) with seeded random
weights on the attention's q and v projections, so vLLM loads real files and its answers differ
from the base model's.

Made with torch and safetensors (what vLLM itself reads), not peft: the files are the format,
and peft would be one more pinned dependency for two tensors per layer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

__all__ = ["make_adapter"]


def make_adapter(
    base: Path, out: Path, *, rank: int = 8, seed: int = 0, base_name: str | None = None
) -> Path:
    """Write an adapter of `base` (a Hugging Face folder) into `out`; returns `out`.
    `base_name`: adapter_config.json's base_model_name_or_path (default: `base` as given),
    where that file is checked in and must come out the same on every machine."""
    config = json.loads((base / "config.json").read_text())
    # A vision-language model (Idefics3) adapts its language model, whose settings nest.
    layers_at = "model.text_model.layers" if "text_config" in config else "model.layers"
    config = config.get("text_config", config)
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim", hidden // heads))
    outputs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for name, width in outputs.items():
            prefix = f"base_model.model.{layers_at}.{layer}.self_attn.{name}"
            shape_a, shape_b = (rank, hidden), (width, rank)
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(shape_a, generator=generator) * 0.05
            # Non-zero B (PEFT starts it at zero): the adapter changes what the model says.
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(shape_b, generator=generator) * 0.05
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "adapter_model.safetensors")
    settings = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name or str(base),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": sorted(outputs),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return out
