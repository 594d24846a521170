"""A closed-loop HTTP load generator: N requests, C at a time, latency of each."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    latencies_s: tuple[float, ...]
    errors: int
    elapsed_s: float

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000 if self.latencies_s else float("nan")

    @property
    def p99_ms(self) -> float:
        return self.percentile(0.99) * 1000


async def run_load(
    url: str,
    body: dict[str, Any],
    *,
    concurrency: int,
    requests: int,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Send `requests` POSTs with `concurrency` in flight; a non-200 counts as an error."""
    remaining = iter(range(requests))
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for _ in remaining:
            started = time.perf_counter()
            try:
                response = await client.post(url, json=body, headers=headers)
            except httpx.HTTPError:
                errors += 1
                continue
            if response.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return LoadResult(concurrency, tuple(latencies), errors, elapsed)
