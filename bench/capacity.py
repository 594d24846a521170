"""Capacity truth: what `python -m cluster.capacity` measures against the engine's own figures.

The demo model as the embedded default runs it (bench/capacity.yaml: 1 GiB of KV cache on the
CPU engine). Anchors, from the same run: the engine's own KV bytes per token (its KV cache spec)
and its KV cache size in blocks. Printed: measured bytes per token over the engine's (target:
within 5%), config.json's arithmetic over the engine's, the largest clean context and the
largest number of 2048-token requests at once over what the blocks hold, memory after load, and
how long the measurement took. Run with `make bench` or `python -m bench.capacity`.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from cluster.capacity import TOLERANCE, measure, table
from core.config import load_config

CONFIG = Path(__file__).with_name("capacity.yaml")
REQUEST_TOKENS = 2048


def main() -> int:
    config = load_config(CONFIG)
    started = time.monotonic()
    result = measure(config, "orchestrator", request_tokens=REQUEST_TOKENS)
    took = time.monotonic() - started
    facts = result.engine
    for line in table(result, 0.8):
        print(line)
    fits_context = min(facts.max_model_len, facts.kv_tokens)
    # Whole blocks a request needs, out of those the engine can hand out (less its null block).
    fits_requests = min(
        facts.max_num_seqs,
        (facts.blocks - 1) // math.ceil(REQUEST_TOKENS / facts.block_size),
    )
    match = result.kv_match
    print()
    print("| figure | measured | anchor (engine) | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| KV bytes/token | {result.measured_bytes_per_token or 0:,.0f} | "
        f"{facts.engine_bytes_per_token} | {match or 0:.3f} |"
    )
    print(
        f"| KV bytes/token, config.json | {result.config_bytes_per_token} | "
        f"{facts.engine_bytes_per_token} | "
        f"{result.config_bytes_per_token / facts.engine_bytes_per_token:.3f} |"
    )
    print(
        f"| largest context | {result.largest_context} | {fits_context} | "
        f"{(result.largest_context or 0) / fits_context:.3f} |"
    )
    print(
        f"| requests of {REQUEST_TOKENS} at once | {result.largest_concurrency} | "
        f"{fits_requests} | {(result.largest_concurrency or 0) / fits_requests:.3f} |"
    )
    print(f"\nmeasured in {took:.0f} s ({len(result.runs)} probe runs: {'; '.join(result.runs)})")
    met = match is not None and abs(match - 1) <= TOLERANCE
    print(
        f"target: measured KV bytes/token within 5% of the engine's: {'met' if met else 'MISSED'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
