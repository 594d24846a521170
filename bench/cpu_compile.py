"""What compiling a CPU engine's graphs buys and costs: vLLM's default (torch.compile) against
`enforce_eager` (what the test configs and ray_configs/local.yaml run), same engine, demo
model, bfloat16, one thread, no prefix cache.

For each, in a child process of its own (an engine per process, vLLM spawns more): the engine's
start (building `LLM`, the compile included), the resident memory of the child and the engine
processes it started, prefill tokens/s of one prompt of about 1,400 tokens, and decode tokens/s
of 64 tokens for one sequence and for two at once (the default's `max_concurrency`). No target:
the figures say which the embedded default should start with.

`python -m bench.cpu_compile` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import json
import sys
import time

import psutil

from bench.cpu_dtype import DECODE_TOKENS, MODEL, PROMPT, in_child

MODES = {"compiled": False, "eager": True}  # mode: enforce_eager
RESULT = "cpu_compile result: "


def tree_rss_mib() -> float:
    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    return sum(p.memory_info().rss for p in processes if p.is_running()) / 2**20


def measure(mode: str) -> dict[str, float]:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=str(MODEL),
        dtype="bfloat16",
        enforce_eager=MODES[mode],
        max_model_len=4096,
        enable_prefix_caching=False,
    )
    start_s = time.perf_counter() - started
    one = SamplingParams(max_tokens=1, temperature=0)
    llm.generate(["Hi"], one)  # warm up
    started = time.perf_counter()
    prompt_tokens = len(llm.generate([PROMPT], one)[0].prompt_token_ids)
    prefill_s = time.perf_counter() - started
    decode = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(["Say something."], decode)
    one_s = time.perf_counter() - started
    started = time.perf_counter()
    llm.generate(["Say something.", "Say something else."], decode)
    two_s = time.perf_counter() - started
    return {
        "start_s": start_s,
        "rss_mib": tree_rss_mib(),
        "prefill_tokens_s": prompt_tokens / prefill_s,
        "decode_tokens_s": DECODE_TOKENS / one_s,
        "decode2_tokens_s": 2 * DECODE_TOKENS / two_s,
    }


def main() -> int:
    figures = {mode: in_child("bench.cpu_compile", mode, RESULT) for mode in MODES}
    anchor = figures["compiled"]
    columns = ("start_s", "rss_mib", "prefill_tokens_s", "decode_tokens_s", "decode2_tokens_s")
    print("| mode | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns))
    for mode, got in figures.items():
        cells = [f"{got[c]:.1f} ({got[c] / anchor[c]:.2f} x)" for c in columns]
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print(f"(ratios against compiled; {DECODE_TOKENS} tokens decoded per sequence)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(RESULT + json.dumps(measure(sys.argv[2])), flush=True)
        sys.exit(0)
    sys.exit(main())
