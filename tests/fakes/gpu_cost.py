"""What a step of vLLM costs on a GPU, as a model (issue 56): the test engine's GPU shape
(tests/fakes/gpu_scheduler.py schedules its steps, tests/fakes/tiny_engine.py runs them).

A decode step reads the weights once for the whole batch, so its time is nearly flat in the
batch size up to a knee and grows with it past that, where the batch's compute outweighs the
read; each sequence's KV cache is read too, so the step grows with the tokens in the batch. A
prefill is compute: tokens over a rate. A step that mixes them (vLLM's chunked prefill) costs the
larger of the two, as a roofline would have it.

This is a model of a GPU, not one: every constant below names the published figure or our own
measurement it comes from (one, the memory vLLM keeps for activations, is an estimate, said so),
and none was tuned to make a bench's verdict come out. Where a GPU
that runs vLLM is ever lent, run the bench there and correct these to match.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class GpuCost:
    """One model on one card under vLLM: step times, prefill rate and the KV cache's size."""

    name: str
    step_ms: float  # a decode step of one sequence
    knee_batch: int  # past it the step grows with every sequence
    knee_step_ms: float  # a decode step of knee_batch sequences
    ms_per_seq_past_knee: float
    kv_read_ms_per_token: float  # each token of context in the batch, each step
    prefill_tokens_per_s: float
    kv_tokens: int  # the KV cache's room, in tokens
    block_tokens: int = 16  # vLLM's KV block on CUDA
    max_num_batched_tokens: int = 8192  # vLLM's API-server default on an H100 or H200
    max_num_seqs: int = 1024  # the same

    def __post_init__(self) -> None:
        shrinks = min(self.ms_per_seq_past_knee, self.kv_read_ms_per_token) < 0
        if shrinks or not (0 < self.step_ms <= self.knee_step_ms) or self.knee_batch < 2:
            raise ValueError(f"{self.name}: a step must not shrink as its batch grows")
        if min(self.prefill_tokens_per_s, self.kv_tokens, self.block_tokens) <= 0:
            raise ValueError(f"{self.name}: prefill rate, KV room and block must be positive")

    def decode_ms(self, batch: int, context_tokens: int = 0) -> float:
        """A decode step of `batch` sequences holding `context_tokens` in all."""
        if batch <= 0:
            return 0.0
        if batch <= self.knee_batch:
            rise = (self.knee_step_ms - self.step_ms) * (batch - 1) / (self.knee_batch - 1)
            base = self.step_ms + rise
        else:
            base = self.knee_step_ms + self.ms_per_seq_past_knee * (batch - self.knee_batch)
        return base + self.kv_read_ms_per_token * context_tokens

    def prefill_ms(self, tokens: int) -> float:
        return 1000.0 * tokens / self.prefill_tokens_per_s

    def step_s(self, sequences: int, context_tokens: int, prefill_tokens: int) -> float:
        """One engine step: `sequences` scheduled (decoding or prefilling), the context they
        hold, and the prompt tokens prefilled in it; the larger of reading and computing."""
        if sequences <= 0:
            return 0.0
        return max(self.decode_ms(sequences, context_tokens), self.prefill_ms(prefill_tokens)) / 1e3

    def blocks(self, tokens: int) -> int:
        """The KV blocks `tokens` take."""
        return ceil(tokens / self.block_tokens)

    @property
    def kv_blocks(self) -> int:
        return self.kv_tokens // self.block_tokens


# Llama-3.1-8B-Instruct in bf16 on one H100-80GB-HBM3 under vLLM. The curve's shape is the lent
# H200's (bench/gpu_decode_step.h200.json, plain torch, context 512 and 2,048): its bare step
# grows 1.29 x from 1 to 64 sequences, and NVIDIA's published inter-token latency for this model
# 1.28 x from 1 to 50 concurrent requests, prefills among them (NIM 1.8.0, 4.63 to 5.91 ms;
# docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance). Its level is vLLM's published step
# on an H100; the H200's 4.45 ms step of one at the H100's bandwidth would be 6.38 ms.
_H200_KV_MS = (8.520 - 5.761) / (64 * (2048 - 512))  # 2,048 against 512 tokens at 64: the read
_H200_STEP_MS = {
    b: ms - _H200_KV_MS * 512 * b for b, ms in ((1, 4.463), (64, 5.761), (512, 19.212))
}
_H100_OVER_H200_BANDWIDTH = 4.8 / 3.35  # TB/s: what a memory-bound read takes longer
H100_LLAMA_8B = GpuCost(
    name="h100-llama-3.1-8b",
    # vLLM 0.21.0's time per output token (p50) at concurrency 1, 6.48 ms (6.59 at 4), on one
    # H100-80GB-HBM3: InferenceBench's concurrency sweep (yobitelcomm.github.io/bench/recipes/
    # concurrency-sweep, captured 2026-05-16).
    step_ms=6.48,
    knee_batch=64,
    knee_step_ms=6.48 * _H200_STEP_MS[64] / _H200_STEP_MS[1],  # weights read once: 1.09 x
    # Compute past the knee, which an H100 SXM has as much of as an H200 (989 dense TFLOPS).
    ms_per_seq_past_knee=(_H200_STEP_MS[512] - _H200_STEP_MS[64]) / (512 - 64),
    kv_read_ms_per_token=_H200_KV_MS * _H100_OVER_H200_BANDWIDTH,
    # 47,070 tokens/s at 1,024 and 45,428 at 4,096 on the H200: compute, the same on an H100.
    prefill_tokens_per_s=45_000,
    # 0.9 of 79.6 GiB (vLLM's gpu_memory_utilization) less 14.98 GiB of weights (8.03 B
    # parameters in bf16, the model card's count) and an estimated 2 GiB for activations and
    # CUDA graphs, over 128 KiB a token (32 layers x 8 KV heads x 128, K and V in bf16).
    kv_tokens=int((0.9 * 79.6 - 14.98 - 2.0) * 2**30 / (128 * 2**10)),
)

SHAPES = {shape.name: shape for shape in (H100_LLAMA_8B,)}
