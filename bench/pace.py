"""The gateway's own cost at GPU pace: three paths in front of one zero-cost engine, one run.

A GPU answers a short request in tens of milliseconds, so there the path in front of the engine
is the latency floor and the throughput ceiling. The engine here computes nothing (the test
engine, tests/fakes/tiny_engine.py, through ray.serve.llm's own seam): `orchestrator` answers
whole requests at once, `coding` streams 64 tokens at 2,000 tokens/s (a small model's decode
speed on a GPU). In front of the very same LLMServer replicas:

- (a) bare `ray.serve.llm` (`build_openai_app`, its OpenAiIngress) at /anchor, the anchor
  (the replicas are our LLMServer subclass, which answers the router's background readings);
- (b) our gateway at / with keys and every limit on (the key ledger in the path), context
  fitting, priority and breakers, its router in the ingress (the default);
- (c) a minimal Serve app at /minimal: the proxy and one handle call, the floor.

At 1, 8, 32 and 128 clients, rounds rotating the paths so drift hits all alike: requests/s,
p50 and p99 latency (with an instant engine, all of it is the path's), the CPU the path's Serve
actors spend per request (proxy, front replicas, key ledger and slot broker; the engine replica
beside it), that CPU split by process for whole requests, and for streams the tokens/s each
stream relays over its whole life (its wait for the first token included) and the chunks/s all
of them do.
The load generator runs on the same cores: at high client counts it takes its share, alike for
every path. Each Ray Serve mode (`--modes`: Serve as installed, then its high-throughput mode,
HAProxy in front, whose CPU counts in every path's front) is a cluster of its own in the same
run, the three paths in each, and a last table sets the gateway's figures side by side.
`--engine gpu-model` puts the test engine's model of a GPU under vLLM behind the same three
paths instead (tests/fakes/gpu_cost.py, issue 56: each answer takes the steps an H100 would, a
batch's step nearly flat in its size); every table says so.
Run with `python -m bench.pace` (`--rounds`, `--scale`, `--modes`, `--engine`, `--profile`); in
`make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bench import profile, stack
from bench.overhead import cpu_by_title, cpu_seconds
from deployments.engine.llm_server import ObservedLLMServer
from tests.fakes.gpu_cost import H100_LLAMA_8B
from tests.fakes.gpu_steps import GPU_ENV

CONFIG = Path(__file__).with_name("pace.yaml")
PORT = 18150
API_KEY = "bench-key"
MINIMAL_APP = "minimal"
INSTANT = "orchestrator"  # the engine answers at once
PACED = "coding"  # the engine streams at 2,000 tokens/s
PACED_TOKEN_S = 1 / 2000
STREAM_TOKENS = 64
CLIENTS = (1, 8, 32, 128)
WHOLE_REQUESTS = {1: 300, 8: 800, 32: 1600, 128: 2560}
STREAMS = {1: 60, 8: 240, 32: 480, 128: 1024}
PROXY = "ProxyActor"
LEDGER, BROKER = "KeyLedger", "SlotBroker"  # the gateway's actors in its request path
ENGINE = "LLMServer"
# Ray's own daemons on the node: not the front, but what a path makes them do is the machine's
# (a cancel after each whole answer cost the raylet about 0.8 ms: docs/benchmarks.md).
RAY_DAEMONS = ("raylet", "gcs_server")
# Targets (issue 36), gateway against the anchor.
ADDED_P50_MS_AT_1 = 1.0
THROUGHPUT_AT = {32: 1.0, 128: 1.0}
CPU_RATIO = 1.0
STREAM_RATE_RATIO = 0.95
HEADER_WITHIN_MS = 1.0
IDLE_S = 10.0
# Ray Serve's high-throughput mode (Ray 2.55+): HAProxy as the HTTP ingress, requests straight
# into the ingress replica, gRPC between replicas, the GC frozen after start. Ray's processes
# read the variables as they start, so each mode is a cluster of its own, one after the other.
MODES: dict[str, dict[str, str]] = {
    "default": {},
    "throughput": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
}
HAPROXY = "haproxy"  # its process, whose CPU is every path's front in that mode


@dataclass(frozen=True)
class Engine:
    """What answers behind the three paths, and what every table says of it."""

    name: str
    on: str  # said beside every table: what its figures were measured on
    env: Mapping[str, str] = field(default_factory=dict)  # each model's, over pace.yaml's


GPU_MODEL = H100_LLAMA_8B.name
ENGINES = {
    "zero-cost": Engine(
        "zero-cost", f"the zero-cost engine (streams at {1 / PACED_TOKEN_S:.0f} tokens/s)"
    ),
    "gpu-model": Engine(
        "gpu-model",
        f"a model of a GPU ({GPU_MODEL}, tests/fakes/gpu_cost.py), not a GPU",
        {GPU_ENV: GPU_MODEL},
    ),
}


class MinimalFront:
    """The floor: parse the request, one handle call to the engine's replica, relay."""

    def __init__(self, engines: dict[str, DeploymentHandle]) -> None:
        self._engines = {name: h.options(stream=True) for name, h in engines.items()}

    async def __call__(self, request: Request) -> Response:
        body = ChatCompletionRequest.model_validate(await request.json())
        items = self._engines[body.model].chat.remote(body)
        first = await items.__anext__()
        if not body.stream:
            whole = first[0] if isinstance(first, list) else first
            return JSONResponse(whole.model_dump())

        async def relay() -> AsyncIterator[str]:
            yield _packet(first)
            async for item in items:
                yield _packet(item)

        return StreamingResponse(relay(), media_type="text/event-stream")


def _packet(item: Any) -> str:
    return "".join(item) if isinstance(item, list) else str(item)


@dataclass
class Route:
    name: str
    base: str  # the URL up to /v1
    headers: dict[str, str]
    front: tuple[str, ...]  # process titles of its Serve actors in front of the engine
    api: str = "chat"  # which API's request it sends (API_PATHS; bench/translation.py)


# The same request in each API the gateway speaks, and what its stream's events say.
API_PATHS = {
    "chat": "/chat/completions",
    "responses": "/responses",
    "responses-stored": "/responses",
    "messages": "/messages",
}


@dataclass
class Run:
    """One path at one client count, summed over rounds."""

    latencies_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    stream_rates: list[float] = field(default_factory=list)  # tokens/s, one per stream
    chunks: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    overhead_ms: list[float] = field(default_factory=list)  # x-gateway-overhead-ms
    front_cpu_s: float = 0.0
    front_cpu_by: dict[str, float] = field(default_factory=dict)  # by front process (its title)
    engine_cpu_s: float = 0.0
    ray_cpu_s: float = 0.0  # RAY_DAEMONS', over the same time

    @property
    def done(self) -> int:
        return len(self.latencies_s)

    @property
    def per_s(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s else 0.0

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return float("nan")
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def cpu_ms(self, seconds: float) -> float:
        return 1000 * seconds / max(1, self.done + self.errors)


def routes_at(base_url: str, front: tuple[str, ...] = ()) -> list[Route]:
    """The three paths; `front`: processes in front of every path (HAProxy, where it runs)."""
    return [
        Route(
            "(a) ray.serve.llm",
            f"{base_url}/{stack.ANCHOR_APP}/v1",
            {},
            (*front, PROXY, f"ServeReplica:{stack.ANCHOR_APP}:OpenAiIngress"),
        ),
        Route(
            "(b) gateway",
            f"{base_url}/v1",
            {"Authorization": f"Bearer {API_KEY}"},
            (*front, PROXY, f"ServeReplica:{stack.GATEWAY_APP}:ingress", LEDGER, BROKER),
        ),
        Route(
            "(c) minimal",
            f"{base_url}/{MINIMAL_APP}",
            {},
            (*front, PROXY, f"ServeReplica:{MINIMAL_APP}:MinimalFront"),
        ),
    ]


def engine_overrides(engine: Engine) -> dict[str, Any]:
    """pace.yaml's models with the engine's env_vars laid over theirs."""
    models = yaml.safe_load(CONFIG.read_text())["models"]
    return {"models": [{**m, "env_vars": {**m["env_vars"], **engine.env}} for m in models]}


def deploy(mode: str = "default", engine: Engine = ENGINES["zero-cost"]) -> list[Route]:
    # Our server class on the engine side (ray.serve.llm's LLMServer with the calls the router
    # makes in the background: counters, KV readings), for all three paths alike.
    target = stack.stage(CONFIG, PORT, engine_overrides(engine), server_cls=ObservedLLMServer)
    # The anchor's replicas by backend (`model@pool`); a request names the model.
    engines = {backend.split("@")[0]: handle for backend, handle in target.anchor.items()}
    front = serve.deployment(MinimalFront, max_ongoing_requests=4096)
    serve.run(front.bind(engines), name=MINIMAL_APP, route_prefix=f"/{MINIMAL_APP}")
    return routes_at(target.base_url, (HAPROXY,) if MODES[mode] else ())


def request_body(stream: bool, api: str = "chat") -> dict[str, Any]:
    model, tokens = (PACED, STREAM_TOKENS) if stream else (INSTANT, 8)
    text = "Count from one to a hundred." if stream else "Count from one to ten."
    body: dict[str, Any] = {"model": model}
    if api.startswith("responses"):
        # Codex's store: false, the translation alone; "responses-stored" keeps each response
        # (OpenAI's default), one write to the response keeper more.
        body |= {"input": text, "max_output_tokens": tokens, "store": api == "responses-stored"}
    else:
        body |= {"messages": [{"role": "user", "content": text}], "max_tokens": tokens}
    if stream:
        body["stream"] = True
        if api == "chat":
            body["stream_options"] = {"include_usage": True}
    return body


def _stream_event(api: str, event: dict[str, Any]) -> tuple[bool, int | None]:
    """Whether a stream's event carries text, and the output tokens it reports (None: none)."""
    if api.startswith("responses"):
        kind = event.get("type")
        # max_output_tokens reached ends a response as incomplete, with its usage
        ended = kind in ("response.completed", "response.incomplete")
        usage = event.get("response", {}).get("usage") if ended else None
        return kind == "response.output_text.delta", usage and usage["output_tokens"]
    if api == "messages":
        kind = event.get("type")
        usage = event.get("usage") if kind == "message_delta" else None
        return kind == "content_block_delta", usage and usage["output_tokens"]
    usage = event.get("usage")
    text = any(c.get("delta", {}).get("content") for c in event.get("choices", ()))
    return text, usage and usage["completion_tokens"]


async def _whole(client: httpx.AsyncClient, path: Route, run: Run) -> None:
    started = time.perf_counter()
    try:
        reply = await client.post(
            f"{path.base}{API_PATHS[path.api]}",
            json=request_body(False, path.api),
            headers=path.headers,
        )
    except httpx.HTTPError:
        run.errors += 1
        return
    if reply.status_code != 200:
        run.errors += 1
        return
    run.latencies_s.append(time.perf_counter() - started)
    overhead = reply.headers.get("x-gateway-overhead-ms")
    if overhead is not None:
        run.overhead_ms.append(float(overhead))


async def _stream(client: httpx.AsyncClient, path: Route, run: Run) -> None:
    started = time.perf_counter()
    first: float | None = None
    tokens = chunks = 0
    try:
        async with client.stream(
            "POST",
            f"{path.base}{API_PATHS[path.api]}",
            json=request_body(True, path.api),
            headers=path.headers,
        ) as reply:
            if reply.status_code != 200:
                run.errors += 1
                return
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                text, reported = _stream_event(path.api, json.loads(line[6:]))
                tokens = reported if reported else tokens
                if text:
                    chunks += 1
                    first = first if first is not None else time.perf_counter()
    except httpx.HTTPError:
        run.errors += 1
        return
    ended = time.perf_counter()
    if first is None or tokens != STREAM_TOKENS:
        run.errors += 1
        return
    run.latencies_s.append(ended - started)
    run.ttft_s.append(first - started)
    run.stream_rates.append(tokens / (ended - started))
    run.chunks += chunks


async def load(path: Route, clients: int, requests: int, stream: bool, run: Run) -> None:
    """`requests` sent by `clients` at a time, each client sending its next on an answer."""
    remaining = iter(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    front_before, engine_before = cpu_by_title(path.front), cpu_seconds((ENGINE,))
    ray_before = cpu_seconds(RAY_DAEMONS)

    async def client_loop(client: httpx.AsyncClient) -> None:
        for _ in remaining:
            await (_stream if stream else _whole)(client, path, run)

    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        run.elapsed_s += time.perf_counter() - started
    for title, used in cpu_by_title(path.front).items():
        spent = used - front_before[title]
        run.front_cpu_by[title] = run.front_cpu_by.get(title, 0.0) + spent
        run.front_cpu_s += spent
    run.engine_cpu_s += cpu_seconds((ENGINE,)) - engine_before
    run.ray_cpu_s += cpu_seconds(RAY_DAEMONS) - ray_before


async def idle_cpu(routes: list[Route], seconds: float) -> dict[str, float]:
    """Each path's front CPU in ms per second with no request at all (its background loops:
    health and load readings, gauges, the proxy's own), over the same `seconds` for all."""
    before = {path.name: cpu_seconds(path.front) for path in routes}
    await asyncio.sleep(seconds)
    return {p.name: 1000 * (cpu_seconds(p.front) - before[p.name]) / seconds for p in routes}


async def warm(routes: list[Route]) -> None:
    """Every path once: handles, connections, the key's first use."""
    for path in routes:
        for stream in (False, True):
            await load(path, 4, 20, stream, Run())


async def rotated(
    routes: list[Route],
    rounds: int,
    scale: float,
    clients_levels: tuple[int, ...] = CLIENTS,
    whole: dict[int, int] = WHOLE_REQUESTS,
    streams: dict[int, int] = STREAMS,
) -> dict[tuple[str, bool, int], Run]:
    """Whole requests, then streams, at each client count, in rounds rotating the paths so
    drift hits all alike; by (path, stream, clients)."""
    runs: dict[tuple[str, bool, int], Run] = {}
    for stream, counts in ((False, whole), (True, streams)):
        for clients in clients_levels:
            requests = max(clients, int(counts[clients] * scale))
            for round_index in range(rounds):
                shift = round_index % len(routes)
                for path in routes[shift:] + routes[:shift]:
                    run = runs.setdefault((path.name, stream, clients), Run())
                    await load(path, clients, requests, stream, run)
    return runs


async def measure(
    routes: list[Route], rounds: int, scale: float
) -> tuple[dict[tuple[str, bool, int], Run], dict[str, float]]:
    await warm(routes)
    idle = await idle_cpu(routes, IDLE_S)
    return await rotated(routes, rounds, scale), idle


def _table(title: str, columns: list[str]) -> None:
    print(f"\n{title}")
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))


def report_whole(
    routes: list[Route], runs: dict[tuple[str, bool, int], Run], engine: Engine
) -> bool:
    anchor, gateway, _ = routes
    met = True
    _table(
        f"whole requests (8 tokens), on {engine.on}:",
        [
            *("path", "clients", "req/s", "ratio", "p50 ms", "p99 ms", "errors"),
            *("front CPU ms/req", "CPU ratio", "engine replica CPU ms/req"),
        ],
    )
    for clients in CLIENTS:
        a = runs[(anchor.name, False, clients)]
        a_cpu = a.cpu_ms(a.front_cpu_s)
        for path in routes:
            r = runs[(path.name, False, clients)]
            cpu = r.cpu_ms(r.front_cpu_s)
            print(
                f"| {path.name} | {clients} | {r.per_s:.0f} | {r.per_s / a.per_s:.2f} "
                f"| {r.p(0.5):.2f} | {r.p(0.99):.2f} | {r.errors} | {cpu:.2f} "
                f"| {cpu / a_cpu:.2f} | {r.cpu_ms(r.engine_cpu_s):.2f} |"
            )
        g = runs[(gateway.name, False, clients)]
        met &= g.errors == 0 and g.cpu_ms(g.front_cpu_s) <= CPU_RATIO * a_cpu
        if clients in THROUGHPUT_AT:
            met &= g.per_s >= THROUGHPUT_AT[clients] * a.per_s
    a1, g1, m1 = (runs[(p.name, False, 1)] for p in routes)
    added = g1.p(0.5) - a1.p(0.5)
    met &= added <= ADDED_P50_MS_AT_1
    target = f"target <= +{ADDED_P50_MS_AT_1}"
    print(f"\ngateway p50 at 1 client: {added:+.2f} ms against (a) ({target})")
    measured = g1.p(0.5) - m1.p(0.5)
    if g1.overhead_ms:
        header = statistics.median(g1.overhead_ms)
        within = abs(header - measured) <= HEADER_WITHIN_MS
        met &= within
        print(
            f"x-gateway-overhead-ms median {header:.2f} ms; measured over (c), the floor: "
            f"{measured:.2f} ms ({'within' if within else 'NOT within'} {HEADER_WITHIN_MS} ms)"
        )
    return met


# The columns of the front's split: each front process by what it is, whichever path's.
FRONT_PARTS = ("HAProxy", "Serve's proxy", "front replica", "key ledger", "slot broker")


def front_part(title: str) -> str:
    named = {
        HAPROXY: "HAProxy",
        PROXY: "Serve's proxy",
        LEDGER: "key ledger",
        BROKER: "slot broker",
    }
    return named.get(title, "front replica")


def report_front_split(routes: list[Route], runs: dict[tuple[str, bool, int], Run]) -> None:
    """Where each path's front CPU per whole request goes, process by process: what the gateway
    spends over the minimal app, and in which process. HAProxy only where the mode runs it.
    Last, outside the front: the raylet's and the GCS's over the same time. Their background
    runs by the second and is charged here per request, so paths compare where their rates are
    close; and psutil reads CPU in 10 ms ticks, so take differences of a tick or two as none."""
    columns = ["path", "clients", *FRONT_PARTS, "raylet + GCS (not front)"]
    _table("front CPU ms per whole request, by process:", columns)
    for clients in CLIENTS:
        for path in routes:
            r = runs[(path.name, False, clients)]
            parts = dict.fromkeys(FRONT_PARTS, 0.0)
            for title, used in r.front_cpu_by.items():
                parts[front_part(title)] += used
            cells = " | ".join(f"{r.cpu_ms(used):.2f}" for used in [*parts.values(), r.ray_cpu_s])
            print(f"| {path.name} | {clients} | {cells} |")


def report_streams(
    routes: list[Route], runs: dict[tuple[str, bool, int], Run], engine: Engine
) -> bool:
    anchor, gateway, _ = routes
    met = True
    _table(
        f"streams ({STREAM_TOKENS} tokens), on {engine.on}:",
        [
            *("path", "clients", "tokens/s per stream (p50)", "ratio", "TTFT p50 ms"),
            *("chunks/s", "errors", "front CPU ms/stream"),
        ],
    )
    for clients in CLIENTS:
        a = runs[(anchor.name, True, clients)]
        a_rate = statistics.median(a.stream_rates) if a.stream_rates else float("nan")
        for path in routes:
            r = runs[(path.name, True, clients)]
            rate = statistics.median(r.stream_rates) if r.stream_rates else float("nan")
            ttft = 1000 * statistics.median(r.ttft_s) if r.ttft_s else float("nan")
            print(
                f"| {path.name} | {clients} | {rate:.0f} | {rate / a_rate:.2f} | {ttft:.1f} "
                f"| {r.chunks / r.elapsed_s:.0f} | {r.errors} | {r.cpu_ms(r.front_cpu_s):.2f} |"
            )
            if path is gateway:
                met &= r.errors == 0 and rate >= STREAM_RATE_RATIO * a_rate
    return met


def report(
    routes: list[Route],
    runs: dict[tuple[str, bool, int], Run],
    idle: dict[str, float],
    engine: Engine,
) -> bool:
    _table(f"idle, {IDLE_S:.0f} s with no request, {engine.on}:", ["path", "front CPU ms/s"])
    for path in routes:
        print(f"| {path.name} | {idle[path.name]:.1f} |")
    met = report_whole(routes, runs, engine)
    report_front_split(routes, runs)
    met &= report_streams(routes, runs, engine)
    print(f"\ntargets (issue 36): {'met' if met else 'NOT met'}, on {engine.on}")
    return met


async def profile_gateway(gateway: Route, seconds: int, out: Path, clients: int) -> None:
    """py-spy on the gateway's ingress replica while `clients` send whole requests, then
    streams (`out` and `out` with `.stream` added)."""
    pid = profile.pid_of(f"ServeReplica:{stack.GATEWAY_APP}:ingress")
    for stream, raw in ((False, out), (True, out.with_name(out.name + ".stream"))):
        recorder = profile.record(pid, seconds, raw)
        while recorder.poll() is None:
            requests = max(16, 2 * clients) if stream else max(100, 10 * clients)
            await load(gateway, clients, requests, stream, Run())
        what = "streams" if stream else "whole requests"
        profile.print_top(f"the gateway's ingress replica, {clients} clients, {what}", raw)


def in_mode(mode: str, args: argparse.Namespace) -> tuple[list[Route], dict[Any, Run], bool]:
    """One cluster in `mode`: the three paths measured, reported, and stopped."""
    engine = ENGINES[args.engine]
    print(f"\n## mode: {mode} {MODES[mode] or '(Ray Serve as installed)'}, engine: {engine.name}")
    os.environ.update(MODES[mode])
    try:
        routes = deploy(mode, engine)
        try:
            runs, idle = asyncio.run(measure(routes, args.rounds, args.scale))
            met = report(routes, runs, idle, engine)
            if args.profile:
                out = args.profile.with_name(f"{args.profile.name}.{mode}")
                asyncio.run(profile_gateway(routes[1], 20, out, args.profile_clients))
        finally:
            stack.stop()
    finally:
        for name in MODES[mode]:
            os.environ.pop(name, None)
    return routes, runs, met


def report_modes(measured: dict[str, tuple[list[Route], dict[Any, Run]]], engine: Engine) -> None:
    """The gateway in each mode, beside the minimal app and the anchor in the same mode."""
    _table(
        f"the gateway by mode (whole requests; streams: tokens/s p50), on {engine.on}:",
        [
            *("mode", "clients", "req/s", "over minimal", "over anchor", "front CPU ms/req"),
            *("stream tokens/s", "over anchor"),
        ],
    )
    for mode, (routes, runs) in measured.items():
        anchor, gateway, minimal = (p.name for p in routes)
        for clients in CLIENTS:
            g, a, m = (runs[(name, False, clients)] for name in (gateway, anchor, minimal))
            gs, as_ = (runs[(name, True, clients)] for name in (gateway, anchor))
            rate = statistics.median(gs.stream_rates) if gs.stream_rates else float("nan")
            a_rate = statistics.median(as_.stream_rates) if as_.stream_rates else float("nan")
            print(
                f"| {mode} | {clients} | {g.per_s:.0f} | {g.per_s / m.per_s:.2f} "
                f"| {g.per_s / a.per_s:.2f} | {g.cpu_ms(g.front_cpu_s):.2f} | {rate:.0f} "
                f"| {rate / a_rate:.2f} |"
            )


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.pace")
    parser.add_argument("--rounds", type=int, default=2, help="rotating rounds per level")
    parser.add_argument("--scale", type=float, default=1.0, help="of each level's requests")
    parser.add_argument(
        "--profile", type=Path, help="also profile the gateway's ingress (py-spy) into this file"
    )
    parser.add_argument("--profile-clients", type=int, default=32, help="clients while profiling")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"Ray Serve modes, one cluster each, in this order ({', '.join(MODES)})",
    )
    parser.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="zero-cost",
        help="zero-cost: answers at once or at 2,000 tokens/s; gpu-model: the test engine's model "
        "of a GPU under vLLM (tests/fakes/gpu_cost.py), each table labelled so",
    )
    args = parser.parse_args()
    modes = [mode for mode in args.modes.split(",") if mode]
    unknown = sorted(set(modes) - MODES.keys())
    if unknown:
        parser.error(f"unknown modes {unknown}: choose from {sorted(MODES)}")
    measured: dict[str, tuple[list[Route], dict[Any, Run]]] = {}
    met = True
    for mode in modes:
        routes, runs, mode_met = in_mode(mode, args)
        measured[mode] = (routes, runs)
        met &= mode_met
    report_modes(measured, ENGINES[args.engine])
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
