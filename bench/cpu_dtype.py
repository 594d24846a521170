"""What a CPU engine's dtype costs on this CPU: bfloat16 (the test configs' and local.yaml's)
against float32, same vLLM engine, demo model, one thread, eager, no prefix cache.

For each dtype, in a child process of its own (an engine per process, vLLM spawns more):
prefill tokens/s of one prompt of about 1,400 tokens (one output token), and decode tokens/s of
64 tokens after a short prompt. On an x86 CPU without AVX512-BF16 or AMX, vLLM still runs
bfloat16, through conversions: prefill (compute-bound) pays for them; decode does not (probably
memory: float32 weights are twice the bytes). No target: the figures say which a machine of
this kind should run.

Run with `make bench` (or `python -m bench.cpu_dtype`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from deployments.engine.cpu_features import cpu_flags
from policy.cpu_dtype import NATIVE_BF16_FLAGS

MODEL = Path(__file__).resolve().parent.parent / ".models" / "SmolLM2-135M-Instruct"
DTYPES = ("bfloat16", "float32")
PROMPT = "The router keeps a priority queue per backend and sheds background work first. " * 100
DECODE_TOKENS = 64
RESULT = "cpu_dtype result: "  # the child's answer line among the engine's own output
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


def measure(dtype: str) -> dict[str, float]:
    """One engine of `dtype`: prefill and decode rates (run in a child process)."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(MODEL),
        dtype=dtype,
        enforce_eager=True,
        max_model_len=4096,
        enable_prefix_caching=False,
    )
    one = SamplingParams(max_tokens=1, temperature=0)
    llm.generate(["Hi"], one)  # warm up
    started = time.perf_counter()
    prompt_tokens = len(llm.generate([PROMPT], one)[0].prompt_token_ids)
    prefill_s = time.perf_counter() - started
    decode = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(["Say something."], decode)
    decode_s = time.perf_counter() - started
    return {
        "prompt_tokens": prompt_tokens,
        "prefill_tokens_s": prompt_tokens / prefill_s,
        "decode_tokens_s": DECODE_TOKENS / decode_s,
    }


def in_child(module: str, variant: str, marker: str = RESULT) -> dict[str, float]:
    """`python -m <module> --child <variant>` with the engine's environment: the figures it
    printed after `marker` (one engine per process: vLLM spawns more of its own)."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--child", variant],
        env={**os.environ, **ENGINE_ENV},
        capture_output=True,
        text=True,
    )
    found = [ln for ln in done.stdout.splitlines() if ln.startswith(marker)]
    if done.returncode != 0 or not found:
        raise RuntimeError(
            f"the {variant} engine failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return dict(json.loads(found[-1].removeprefix(marker)))


def main() -> int:
    flags = cpu_flags()
    native = sorted(flags & NATIVE_BF16_FLAGS) or ["none"]
    print(f"CPU: AVX-512 {'yes' if 'avx512f' in flags else 'no'}, native bf16: {', '.join(native)}")
    figures = {dtype: in_child("bench.cpu_dtype", dtype) for dtype in DTYPES}
    anchor = figures["bfloat16"]
    print(f"{'dtype':<10} {'prefill tok/s':>14} {'x bf16':>7} {'decode tok/s':>13} {'x bf16':>7}")
    for dtype, got in figures.items():
        print(
            f"{dtype:<10} {got['prefill_tokens_s']:>14.0f} "
            f"{got['prefill_tokens_s'] / anchor['prefill_tokens_s']:>7.2f} "
            f"{got['decode_tokens_s']:>13.1f} "
            f"{got['decode_tokens_s'] / anchor['decode_tokens_s']:>7.2f}"
        )
    print(f"(a prompt of {anchor['prompt_tokens']:.0f} tokens; {DECODE_TOKENS} tokens decoded)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(RESULT + json.dumps(measure(sys.argv[2])), flush=True)
        sys.exit(0)
    sys.exit(main())
