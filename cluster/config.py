"""Check a config before it starts anything: `python -m cluster.config check [FILE]`.

Loads and validates the file (the embedded default without one), reads each model's config.json
and weight sizes, and runs the config guard (policy/config_guard.py): what cannot start or will
crash is refused, with its arithmetic; what will degrade is warned about. Exit status 0 when
nothing is refused, 1 when something is, 2 when the file itself is invalid. `serve run` runs
the same guard at start (cluster/app.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cluster.model_files import model_geometries
from core.config import ClusterConfig, ConfigError, load_config
from policy.config_guard import Finding, guard_config
from policy.engine_memory import GiB, ModelGeometry, plan_engine

__all__ = ["check", "main", "summary"]


def check(config: ClusterConfig) -> list[Finding]:
    return guard_config(config, model_geometries(config))


def summary(config: ClusterConfig) -> list[str]:
    """One line per model: what its engine will hold."""
    lines = []
    for i, geometry in model_geometries(config).items():
        model = config.models[i]
        if not isinstance(geometry, ModelGeometry):
            lines.append(f"{model.role.value}: {model.source} not read")
            continue
        pool = config.pool(model.home_pool)
        gpu = None if pool.gpu_memory_gb is None else int(pool.gpu_memory_gb * GiB)
        plan = plan_engine(model, geometry, gpu)
        tokens = plan.kv_tokens
        kv = (
            "KV cache unknown before start"
            if tokens is None
            else f"KV cache {tokens} tokens = {tokens // model.context_window} full windows"
        )
        lines.append(
            f"{model.role.value}: weights {plan.weight_bytes / GiB:.2f} GiB, "
            f"{plan.kv_bytes_per_token} KV bytes/token, {kv} of {model.context_window}, "
            f"router cap {model.cap} over {model.replicas} replica(s), "
            f"max_num_seqs {plan.max_num_seqs}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.config")
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="refuse what cannot start, warn what degrades")
    checking.add_argument("file", nargs="?", help="config YAML (default: the embedded one)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.file)
    except ConfigError as error:
        print(f"gpu-pool-serve: {error}", file=sys.stderr)
        return 2
    for line in summary(config):
        print(line)
    findings = check(config)
    for finding in findings:
        print(finding)
    refused = sum(f.level == "refuse" for f in findings)
    warned = sum(f.level == "warn" for f in findings)
    print(f"{'REFUSED' if refused else 'OK'}: {refused} refused, {warned} warnings")
    return 1 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
