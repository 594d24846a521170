"""The shipped Grafana dashboard and alert rules ask only for metrics the gateway exports, in
PromQL that Prometheus accepts (checked by `promtool` as recording rules)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.ingress import metrics as ingress_metrics
from deployments.keys.ledger import KeyLedger, MemorySnapshots
from deployments.router import metrics as router_metrics
from policy.key_limits import Settlement

DEPLOY = Path(__file__).parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "gpu-pool-serve.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported() -> set[str]:
    """Every sample name the gateway's /metrics can carry: the ingress's and router's
    families, and the key ledger's as it renders them for a key in use."""
    families: list[Any] = [
        *ingress_metrics.REGISTRY.collect(),
        *router_metrics.REGISTRY.collect(),
    ]
    names = {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}
    ledger = KeyLedger("unit", store=MemorySnapshots())

    async def rendered() -> str:
        await ledger.settle([Settlement("k", "l", 1, 1, "month", admitted=False)])
        return (await ledger.metrics_text()).decode()

    samples = [line for line in asyncio.run(rendered()).splitlines() if line[:1] != "#"]
    return names | {line.split("{")[0].split(" ")[0] for line in samples}


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"\b(gps_[a-z_]+)", text))


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in board["panels"] for t in panel["targets"]]


def alert_exprs() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_every_gps_metric_asked_for_is_exported() -> None:
    names = exported()
    asked = {n for expr in dashboard_exprs() + alert_exprs() for n in _names_in(expr)}
    assert asked, "no gps_* metric found in the dashboard or the alerts"
    assert asked <= names, sorted(asked - names)


def test_the_dashboard_covers_what_operators_look_at() -> None:
    titles = " / ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]).lower()
    for topic in ("requests/s", "first token", "inter-token", "queue", "shed", "breaker",
                  "failover", "kv-cache", "placement", "pool"):  # fmt: skip
        assert topic in titles, topic


def test_every_dashboard_query_is_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: `make test` installs Debian's prometheus package")
    rules = [
        {"record": f"dashboard:panel_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
