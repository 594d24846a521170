"""Check a config before it starts anything: `python -m cluster.config check [FILE]`; print the
config's JSON Schema (for editors: `python -m cluster.config schema`).

Loads and validates the file (the embedded default without one), reads each model's config.json
and weight sizes, and runs the config guard (policy/config_guard.py): what cannot start or will
crash is refused, with its arithmetic; what will degrade is warned about. Exit status 0 when
nothing is refused, 1 when something is, 2 when the file itself is invalid. `serve run` runs
the same guard at start (cluster/app.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.config_docs import reference
from cluster.model_files import model_geometries
from core.config import ClusterConfig, ConfigError, load_config
from policy.config_guard import Finding, guard_config, guarded_plan
from policy.engine_memory import GiB, ModelGeometry

__all__ = ["SCHEMA_FILE", "check", "json_schema", "main", "schema", "summary"]

# Checked in, so editors complete and check keys (`# yaml-language-server: $schema=...` atop
# each example config); tests/unit/test_config_schema.py fails when it is out of date.
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "ray_configs" / "gps-config.schema.json"


def schema() -> dict[str, Any]:
    """The YAML file's JSON Schema, from the config models (their types, bounds, defaults and
    descriptions, keys in the order the models declare them)."""
    found = ClusterConfig.model_json_schema()
    found["properties"].pop("base_dir", None)  # set by the loader, never written in a file
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **found,
        "title": "gpu-pool-serve config",
    }


def json_schema() -> str:
    """`schema()` as `SCHEMA_FILE` holds it."""
    return json.dumps(schema(), indent=2) + "\n"


def check(config: ClusterConfig) -> list[Finding]:
    return guard_config(config, model_geometries(config))


def summary(config: ClusterConfig) -> list[str]:
    """One line per model: what its engine will hold."""
    lines = []
    for i, geometry in model_geometries(config).items():
        model = config.models[i]
        if not isinstance(geometry, ModelGeometry):
            lines.append(f"{model.name}: {model.source} not read")
            continue
        pool = config.pool(model.home_pool)
        gpu = None if pool.gpu_memory_gb is None else int(pool.gpu_memory_gb * GiB)
        plan = guarded_plan(model, geometry, gpu)
        tokens = plan.kv_tokens
        kv = (
            "KV cache unknown before start"
            if tokens is None
            else f"KV cache {tokens} tokens = {tokens // model.context_window} full windows"
        )
        lines.append(
            f"{model.name}: weights {plan.weight_bytes / GiB:.2f} GiB, "
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
    commands.add_parser("schema", help="print the config's JSON Schema")
    commands.add_parser("docs", help="print the config reference (docs/configuration.md)")
    args = parser.parse_args(argv)
    if args.command == "schema":
        sys.stdout.write(json_schema())
        return 0
    if args.command == "docs":
        sys.stdout.write(reference(schema()))
        return 0
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
