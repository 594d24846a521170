"""What vLLM's 1 s spin between steps costs a CPU engine, against the 2 ms our CPU engines get
(deployments/engine/shm_spin.py): the same engine of the demo model (bfloat16, eager, one
thread), its processes spawned as in a replica (the `.pth` hook sets the window in them).

For each window, in a child process of its own (an engine per process, vLLM spawns more):
- spaced: ten answers of 16 tokens, 2 s apart (light traffic, and most of what a test suite
  sends): the CPU its EngineCore and worker used from the first request to 2 s after the last,
  per answer, and the median answer's time;
- back to back: twenty answers of 32 tokens one after another: decode tokens/s and CPU.

Targets: the engine's CPU per spaced answer at most 0.5 x vLLM's default, and back-to-back
decode at least 0.9 x its tokens/s (the sleep costs a wake-up per step where a step's gap
passes 2 ms).

`python -m bench.engine_spin` (about 3 minutes on 2 cores; in `make bench`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import psutil

from bench.cpu_dtype import MODEL, in_child
from deployments.engine.parent_death import ENV as PARENT_DEATH_ENV
from deployments.engine.shm_spin import CPU_ENGINE_S, ENV

WINDOWS = {"vLLM's 1 s": None, f"ours, {float(CPU_ENGINE_S) * 1000:g} ms": CPU_ENGINE_S}
RESULT = "engine_spin result: "
SPACED, SPACED_TOKENS, GAP_S = 10, 16, 2.0
IN_A_ROW, IN_A_ROW_TOKENS = 20, 32
CPU_TARGET, DECODE_TARGET = 0.5, 0.9


def engine_cpu_s() -> dict[int, float]:
    """CPU seconds of this process's engine processes so far, by pid."""
    used: dict[int, float] = {}
    for process in psutil.Process().children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        used[process.pid] = times.user + times.system
    return used


def used_since(before: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in engine_cpu_s().items())


def measure(variant: str) -> dict[str, float]:
    """One engine with the window of `variant` (run in a child process)."""
    window = WINDOWS[variant]
    os.environ.pop(ENV, None)
    if window is not None:
        os.environ[ENV] = window
    # As in a replica: spawned engine processes (vLLM forces spawn in a Ray actor), which
    # run the `.pth` hook.
    os.environ[PARENT_DEATH_ENV] = "1"
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(MODEL),
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=2048,
        kv_cache_memory_bytes=128 << 20,
        enable_prefix_caching=False,
    )
    short = SamplingParams(max_tokens=SPACED_TOKENS, temperature=0, ignore_eos=True)
    llm.generate(["Hi"], short, use_tqdm=False)  # warm up
    time.sleep(GAP_S)
    before = engine_cpu_s()
    answers = []
    for i in range(SPACED):
        started = time.perf_counter()
        llm.generate([f"Say something, {i}."], short, use_tqdm=False)
        answers.append(time.perf_counter() - started)
        time.sleep(GAP_S)
    spaced_cpu = used_since(before)
    longer = SamplingParams(max_tokens=IN_A_ROW_TOKENS, temperature=0, ignore_eos=True)
    before = engine_cpu_s()
    started = time.perf_counter()
    for i in range(IN_A_ROW):
        llm.generate([f"Say something else, {i}."], longer, use_tqdm=False)
    in_a_row_s = time.perf_counter() - started
    return {
        "spaced_cpu_s": spaced_cpu / SPACED,
        "spaced_answer_ms": statistics.median(answers) * 1000,
        "decode_tokens_s": IN_A_ROW * IN_A_ROW_TOKENS / in_a_row_s,
        "in_a_row_cpu_s": used_since(before) / IN_A_ROW,
    }


def main() -> int:
    figures = {variant: in_child("bench.engine_spin", variant, RESULT) for variant in WINDOWS}
    anchor = figures[next(iter(WINDOWS))]
    columns = ("spaced_cpu_s", "spaced_answer_ms", "decode_tokens_s", "in_a_row_cpu_s")
    print("| window | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns))
    for variant, got in figures.items():
        cells = [f"{got[c]:.3g} ({got[c] / anchor[c]:.2f} x)" for c in columns]
        print(f"| {variant} | " + " | ".join(cells) + " |")
    ours = figures[list(WINDOWS)[1]]
    cpu = ours["spaced_cpu_s"] / anchor["spaced_cpu_s"]
    decode = ours["decode_tokens_s"] / anchor["decode_tokens_s"]
    met = cpu <= CPU_TARGET and decode >= DECODE_TARGET
    print(
        f"engine CPU per spaced answer {cpu:.2f} x (target <= {CPU_TARGET}), back-to-back "
        f"decode {decode:.2f} x (target >= {DECODE_TARGET}): {'met' if met else 'NOT met'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(RESULT + json.dumps(measure(sys.argv[2])), flush=True)
        sys.exit(0)
    sys.exit(main())
