"""What a decode step and a prefill cost on a real NVIDIA GPU, by batch size: the shape the
GPU-shaped test engine (issue 56) models. Run on a lent GPU (`device` tool), with nothing of ours
but torch: `python3 -m bench.gpu_decode_step --out FILE.json`.

It is not vLLM (no CUDA vLLM can be carried to the lent machine): it is a Llama-shaped decoder
built from random bf16 weights in plain torch, each layer's projections, grouped-query attention
over a KV cache (torch's scaled_dot_product_attention) and its MLP, plus the LM head, replayed
from a CUDA graph as vLLM replays its decode steps. So it measures the hardware's side of the
cost (weights read once per step for the whole batch, KV read per sequence, compute past the
knee) and none of vLLM's scheduling or paged-attention kernels: a lower bound on vLLM's step.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16

    def weight_bytes(self) -> int:
        per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer += self.hidden * self.hidden + 3 * self.hidden * self.intermediate
        return 2 * (self.layers * per_layer + self.vocab * self.hidden)


# Llama-3.1-8B and Llama-3.2-1B's published configs (config.json on their model cards).
SHAPES = (
    Shape("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256),
    Shape("llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256),
)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTEXTS = (512, 2048)
PREFILLS = (256, 1024, 4096, 16384)
KV_BUDGET_BYTES = 60 * 2**30  # the cache this bench lets one (batch, context) take


def _random(*size: int) -> torch.Tensor:
    return torch.randn(*size, device="cuda", dtype=torch.bfloat16)


class Decoder:
    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        d, h = shape.hidden, shape.head_dim
        self.layers = [
            (
                _random(d, (shape.heads + 2 * shape.kv_heads) * h) * 0.02,
                _random(d, d) * 0.02,
                _random(d, 2 * shape.intermediate) * 0.02,
                _random(shape.intermediate, d) * 0.02,
            )
            for _ in range(shape.layers)
        ]
        self.head = _random(d, shape.vocab) * 0.02

    def _attend(
        self, x: torch.Tensor, qkv_w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        s, b, t = self.shape, x.shape[0], x.shape[1]
        qkv = (x @ qkv_w).view(b, t, s.heads + 2 * s.kv_heads, s.head_dim).transpose(1, 2)
        q = qkv[:, : s.heads]
        if causal:  # prefill: attend over its own keys
            k, v = qkv[:, s.heads : s.heads + s.kv_heads], qkv[:, s.heads + s.kv_heads :]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2).reshape(b, t, s.hidden)

    def forward(
        self, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> torch.Tensor:
        for i, (qkv_w, o_w, up_w, down_w) in enumerate(self.layers):
            k, v = caches[i] if caches else (x, x)
            x = x + self._attend(x, qkv_w, k, v, causal=caches is None) @ o_w
            gate, up = (x @ up_w).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ down_w
        logits: torch.Tensor = x[:, -1] @ self.head
        return logits


def graph_ms(run: Callable[[], object], replays: int = 20) -> float:
    """Capture `run` in a CUDA graph and time its replays (ms per replay)."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):
        graph.replay()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    ms = float(start.elapsed_time(end)) / replays
    del graph
    return ms


def decode_steps(model: Decoder) -> list[dict[str, float]]:
    s, rows = model.shape, []
    for context in CONTEXTS:
        for batch in BATCHES:
            if batch * context * s.kv_bytes_per_token() > KV_BUDGET_BYTES:
                continue
            caches = [
                (
                    _random(batch, s.kv_heads, context, s.head_dim),
                    _random(batch, s.kv_heads, context, s.head_dim),
                )
                for _ in range(s.layers)
            ]
            x = _random(batch, 1, s.hidden)
            with torch.no_grad():
                ms = graph_ms(partial(model.forward, x, caches))
            rows.append(
                {
                    "context": context,
                    "batch": batch,
                    "step_ms": round(ms, 3),
                    "tokens_per_s": round(batch * 1000 / ms),
                }
            )
            print(
                f"{s.name} decode context {context:5} batch {batch:5}: {ms:8.3f} ms/step, "
                f"{batch * 1000 / ms:10.0f} tokens/s",
                flush=True,
            )
            del caches
            torch.cuda.empty_cache()
    return rows


def prefills(model: Decoder) -> list[dict[str, float]]:
    rows = []
    for tokens in PREFILLS:
        x = _random(1, tokens, model.shape.hidden)
        with torch.no_grad():
            for _ in range(2):
                model.forward(x, None)
            torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(5):
                model.forward(x, None)
            torch.cuda.synchronize()
        ms = (time.perf_counter() - began) * 1000 / 5
        rows.append(
            {"tokens": tokens, "ms": round(ms, 2), "tokens_per_s": round(tokens * 1000 / ms)}
        )
        print(
            f"{model.shape.name} prefill {tokens:6} tokens: {ms:8.2f} ms, "
            f"{tokens * 1000 / ms:10.0f} tokens/s",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_decode_step.json")
    args = parser.parse_args()
    models: list[dict[str, object]] = []
    for shape in SHAPES:
        model = Decoder(shape)
        models.append(
            {
                "shape": asdict(shape),
                "weight_gib": round(shape.weight_bytes() / 2**30, 2),
                "kv_kib_per_token": shape.kv_bytes_per_token() // 1024,
                "decode": decode_steps(model),
                "prefill": prefills(model),
            }
        )
        del model
        torch.cuda.empty_cache()
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "models": models,
    }
    with open(args.out, "w") as out:
        json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
