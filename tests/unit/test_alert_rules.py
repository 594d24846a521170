"""The shipped alert rules (deploy/prometheus/alerts.yaml) under Prometheus's own rule tester:
each alert quiet before its `for` has passed, then firing with its labels, summary and runbook.
Needs `promtool` (Debian's `prometheus` package; `make test` installs it)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "alerts.yaml"


@dataclass(frozen=True)
class Case:
    alert: str
    series: dict[str, str]  # series -> promtool's values notation, one sample per 15 s
    quiet_at: str
    firing_at: str
    labels: dict[str, str]
    summary: str


CASES = [
    Case(
        "GpsKvCachePressure",
        {'gps_kv_cache_usage{backend="coding@local"}': "0.5 0.9x20"},
        "45s",
        "2m",
        {"backend": "coding@local", "severity": "warning"},
        "KV cache of coding@local averaged above 88% for the last minute (90%)",
    ),
    Case(
        "GpsQueueWaitHigh",
        {  # every wait between 10 and 30 s: p99 near 30 s
            'gps_queue_wait_seconds_bucket{priority="user",le="10"}': "0x60",
            'gps_queue_wait_seconds_bucket{priority="user",le="30"}': "0+1x60",
            'gps_queue_wait_seconds_bucket{priority="user",le="+Inf"}': "0+1x60",
        },
        "3m",
        "8m",
        {"priority": "user", "severity": "warning"},
        "p99 wait for a slot is 29.8s for user requests",
    ),
    Case(
        "GpsShedding",
        {'gps_shed_total{priority="background",reason="queue_full"}': "0+30x60"},
        "3m",
        "8m",
        {"priority": "background", "severity": "warning"},
        "background requests refused with 429 (2/s)",
    ),
    Case(
        "GpsBreakerOpen",
        {
            'gps_breaker_state{backend="coding@local",state="open"}': "1x20",
            'gps_breaker_state{backend="coding@local",state="closed"}': "0x20",
            'gps_breaker_state{backend="orchestrator@local",state="closed"}': "1x20",
        },
        "1m",
        "3m",
        {"backend": "coding@local", "severity": "critical"},
        "Breaker of coding@local not closed for 2 minutes",
    ),
    Case(
        "GpsFallbackServing",
        {
            'gps_request_seconds_count{backend="cpu-fallback",priority="user",status="200"}': (
                "0+1x40"
            )
        },
        "1m",
        "4m",
        {"severity": "warning"},
        "The CPU fallback is answering requests",
    ),
    Case(
        "GpsPoolNotHealthy",
        {
            'gps_pool_state{pool="cloud",state="draining"}': "1x20",
            'gps_pool_state{pool="cloud",state="healthy"}': "0x20",
            'gps_pool_state{pool="local",state="healthy"}': "1x20",
        },
        "1m",
        "3m",
        {"pool": "cloud", "state": "draining", "severity": "critical"},
        "Pool cloud is draining",
    ),
    Case(
        "GpsScrapeDown",
        {'up{job="gpu-pool-serve",instance="localhost:8000"}': "0x10"},
        "30s",
        "2m",
        {"instance": "localhost:8000", "job": "gpu-pool-serve", "severity": "critical"},
        "Prometheus cannot scrape the gateway at localhost:8000",
    ),
]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: `make test` installs Debian's prometheus package")
    return found


def runbooks() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["annotations"]["runbook"] for g in groups for r in g["rules"]}


def rule_test(case: Case, runbook: str) -> dict[str, Any]:
    firing = {
        "exp_labels": case.labels,
        "exp_annotations": {"summary": case.summary, "runbook": runbook},
    }
    return {
        "interval": "15s",
        "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        "alert_rule_test": [
            {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
            {"eval_time": case.firing_at, "alertname": case.alert, "exp_alerts": [firing]},
        ],
    }


def test_the_rules_are_valid() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_shipped_alert_has_a_case_and_a_runbook() -> None:
    assert sorted(runbooks()) == sorted(c.alert for c in CASES)
    assert all(text.strip() for text in runbooks().values())


def test_each_alert_waits_for_its_time_then_fires_with_its_labels(tmp_path: Path) -> None:
    books = runbooks()
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [rule_test(case, books[case.alert]) for case in CASES],
    }
    tests = tmp_path / "alerts.test.yaml"
    tests.write_text(yaml.safe_dump(spec, sort_keys=False))
    ran = subprocess.run(
        [promtool(), "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
