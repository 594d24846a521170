"""What Ray's metrics export loses on a node out of CPU, by export interval.

Ray's workers export counters to their node's metrics agent as deltas, one collect-and-export
cycle per `metrics_report_interval_ms`, each with half the interval as its timeout; a cycle that
misses it is dropped with the deltas it held, silently (Ray turns OpenTelemetry's own log off;
here it is on, and the dropped cycles are counted from the worker's .err log). In one Ray
worker, answered requests are recorded with the gateway's real metric objects (bench/metrics.py's
records and a stream's timings) over a fleet's series (20 backends by default, three classes,
four outcomes, three endpoints), again and again while busy processes take every core;
afterwards the agent's `ray_gps_requests_total` is compared with the requests recorded. The
anchor is Ray's default interval, 10 s, measured in the same run on a cluster of its own; the
other is 1 s, what docs/operations.md offers for finer alert rules.

Target: nothing lost at the default interval. Run with `make bench` or
`python -m bench.metrics_export [--busy N] [--seconds S] [--backends N]`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import ray

PRIORITIES = ("user", "agent", "background")
ENDPOINTS = ("chat", "completions", "embeddings")
STATUSES = (200, 429, 499, 503)


class Ingress:
    """A worker like an ingress replica's in front of a fleet: the gateway's real metric
    objects, one answered request's records (bench/metrics.py's, and a stream's) over
    `backends` backends, three classes, four outcomes and three endpoints, so each export
    carries a fleet's series, not one."""

    def __init__(self, backends: int) -> None:
        from deployments.ingress import metrics as ingress
        from deployments.router import metrics as router

        self.ingress, self.router = ingress, router
        self.backends = [f"model-{n}@pool-{n % 3}" for n in range(backends)]
        self.answered = 0

    def answer(self, requests: int) -> int:
        ingress, router = self.ingress, self.router
        for _ in range(requests):
            n = self.answered
            backend, priority = self.backends[n % len(self.backends)], PRIORITIES[n % 3]
            status = STATUSES[(n // len(self.backends)) % 4]
            timing = ingress.StreamTiming(backend, priority, 0.0)
            timing.relayed(1, now=0.01 * (n % 60))
            timing.relayed(4, now=0.02 * (n % 60) + 0.1)
            router.QUEUE_WAIT_SECONDS.labels(priority).observe(0.001 * (n % 50))
            router.IN_FLIGHT.labels(backend).set(1)
            ingress.CONTEXT_FITS.labels(backend).inc()
            ingress.observe_tokens(backend, 120 + n % 7, 16)
            ingress.observe_answer(backend, priority, status, 0.05 * (n % 40))
            router.IN_FLIGHT.labels(backend).set(0)
            ingress.observe_request(ENDPOINTS[n % 3], 200, 0.02 * (n % 30))
            self.answered += 1
        return self.answered


DEFAULT_INTERVAL_MS = 10_000  # Ray's own
FINE_INTERVAL_MS = 1_000
DROPPED_CYCLE = "Collect took longer configured time"
SPIN = "while True: pass"


def dropped_cycles(logs: Path) -> dict[str, int]:
    """Export cycles each worker of a cluster dropped so far, by WorkerId, from the .err logs
    in `logs` (its session's logs folder), with OpenTelemetry's log on."""
    return {
        path.name.split("-")[1]: path.read_text(errors="replace").count(DROPPED_CYCLE)
        for path in logs.glob("worker-*.err")
    }


def agent_count(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ray_gps_requests_total{")
    )


def one_interval(
    interval_ms: int, busy: int, seconds: float, backends: int
) -> tuple[int, float, int]:
    """Requests recorded, requests the agent holds once settled, and cycles dropped."""
    # The cluster's processes inherit it from here, so their .err logs name a dropped cycle.
    os.environ["RAY_disable_open_telemetry_sdk_log"] = "0"  # noqa: SIM112 (Ray reads this case)
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        _system_config={"metrics_report_interval_ms": interval_ms},
    )
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        actor: Any = ray.remote(num_cpus=0)(Ingress)
        replica = actor.remote(backends)
        recorded = ray.get(replica.answer.remote(1))  # the worker is up, its exporter started
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            recorded = ray.get(replica.answer.remote(20))
        for spinner in spinners:
            spinner.kill()
        port = ray.nodes()[0]["MetricsExportPort"]
        # Settled: the agent's count unchanged over three intervals (or all counted).
        readings: list[float] = []
        while len(readings) < 3 or len(set(readings[-3:])) > 1:
            time.sleep(interval_ms / 1000 + 1)
            readings.append(agent_count(port))
            if readings[-1] == recorded:
                break
        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
        dropped = sum(dropped_cycles(logs).values())
        return recorded, readings[-1], dropped
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, default=40, help="busy processes beside the worker")
    parser.add_argument("--seconds", type=float, default=60, help="recording time per interval")
    parser.add_argument("--backends", type=int, default=20, help="backends the series span")
    args = parser.parse_args()
    results = {
        interval: one_interval(interval, args.busy, args.seconds, args.backends)
        for interval in (DEFAULT_INTERVAL_MS, FINE_INTERVAL_MS)
    }
    print(
        f"requests counted through Ray's metrics export, {args.backends} backends' series, "
        f"{args.busy} busy processes beside:"
    )
    for interval, (recorded, counted, dropped) in results.items():
        lost = recorded - counted
        anchor = " (Ray's default, the anchor)" if interval == DEFAULT_INTERVAL_MS else ""
        print(
            f"  every {interval / 1000:4.0f} s{anchor}: {counted:.0f} of {recorded} counted, "
            f"{lost:.0f} lost ({lost / recorded:.1%}), {dropped} export cycles dropped"
        )
    recorded, counted, _ = results[DEFAULT_INTERVAL_MS]
    verdict = "meets" if counted == recorded else "MISSES"
    print(f"  {verdict} the target: nothing lost at Ray's default interval")
    return 0 if counted == recorded else 1


if __name__ == "__main__":
    sys.exit(main())
