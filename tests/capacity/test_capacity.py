"""`python -m cluster.capacity` on the real CPU engine: the demo model with a 3072-token cache.

What must hold: the engine's KV cache is read (25 blocks of 128, one of them vLLM's null block),
in the dtype this node serves (float32 where its CPU lacks bf16 math); the measured KV bytes per
token match the engine's own figure within 5% (and config.json's arithmetic); the largest
context and concurrency are what that cache holds (3072 tokens; 3 requests of 1024, since a
fourth does not fit); the fragment takes 80% of each; and no engine process outlives the
command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from deployments.engine.cpu_features import node_has_native_bf16
from policy.engine_memory import DTYPE_BYTES
from tests.own_processes import own_engine_processes

ROOT = Path(__file__).parents[2]
CONFIG = Path(__file__).with_name("capacity.yaml")


def test_the_capacity_command_measures_the_engine_and_writes_a_fragment(tmp_path: Path) -> None:
    before = own_engine_processes()
    out = tmp_path / "fragment.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "cluster.capacity", "orchestrator", "--config", str(CONFIG),
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    report = done.stdout + done.stderr[-3000:]
    print(done.stdout)
    assert done.returncode == 0, report
    rows = dict(
        (name.strip(), value.strip())
        for name, value in (
            line.split("  ", 1) for line in done.stdout.splitlines() if "  " in line
        )
    )
    assert rows["KV cache"] == "25 blocks x 128, one held back: 3072 tokens", report
    # bfloat16 where this CPU computes it, float32 (twice the bytes) where vLLM would emulate it
    served = "bfloat16" if node_has_native_bf16() else "float32"
    per_token = str(23040 * DTYPE_BYTES[served] // 2)
    assert rows["dtype"] == served, report
    assert rows["KV bytes/token, engine's own"] == per_token, report
    assert rows["KV bytes/token, from config.json"] == per_token, report
    ratio = float(rows["KV bytes/token, measured"].split("(")[1].split(" x")[0])
    assert abs(ratio - 1) <= 0.05, report
    assert rows["largest context, no preemption"] == "3072", report
    assert rows["largest concurrency at 1024 tokens"] == "3", report
    fragment = yaml.safe_load(out.read_text())
    [entry] = fragment["models"]
    assert entry == {
        "name": "orchestrator",
        "context_window": 2457,  # 80% of 3072
        "max_concurrency": 2,  # 80% of 3
        "engine_kwargs": {"max_num_seqs": 2},
    }
    assert own_engine_processes() == before
