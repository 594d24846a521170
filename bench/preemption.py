"""Users beside background work inside the cap: the router's preemption off and on, one run.

One backend of the demo model (bench/overload.yaml, its cap raised to `--cap`, 8 by default):
background streams fill its background share (half the cap: four long answers at a time,
closed loop, 256 tokens each with `ignore_eos`), so admission alone never makes a user wait,
but every user request joins their batch. Users send one request every 0.5 s (open loop, 16
tokens), measured alone first, then beside the background streams, with `router.preempt` off
and then on (the gateway redeployed in front of the very same engine replica):

- users: p50 and p99 latency, loaded against the unloaded run of the same variant, errors;
- background: errors (an error event or a status other than 200), tokens per second received
  over the phase (what the paused answers lost to the users), pauses (the streams'
  `: gps-paused` comments, whichever router paused them) and the prompt tokens their
  continuations sent again (`gps_preempt_reprefill_tokens_total` from the gateway's /metrics:
  with several ingress replicas, the one router that answers the scrape).

Targets (issue 37), preemption on: user p99 loaded <= 1.3 x unloaded, no user and no background
errors, background tokens/s >= 0.5 x the run with preemption off.

`--engine gpu-model` runs every variant on the test engine's model of a GPU under vLLM
instead of the CPU engine (tests/fakes/gpu_cost.py, issue 56: a decode step nearly flat in its
batch, prefill at a rate, vLLM V1's priority scheduler over a KV cache); every figure it prints
says so beside it.

Run with `python -m bench.preemption` (`--requests`, `--above-running`, `--cap`, `--engine`,
`--resume-after`: hold-downs to try, `--ingress-replicas`: several routers, each setting also
with `shared_slots` off, where each router weighs only what it runs); in `make bench`.

`--shape embedded` is the embedded default's shape instead (issue 52): a cap of 2, six
background streams (more than background's share holds: they wait and age past every class),
a user every 0.5 s, the router's default queue. Each variant runs users alone, background
alone and both; the first variant lets background fill the whole cap (class_shares 1.0: what
aged background work took before aging kept to its own share), then the shares as shipped with
preemption off (the defaults) and on, with and without hold-downs. Targets, for the defaults:
user p99 loaded <= 1.5 x unloaded, background tokens/s >= 0.3 x background alone in the same
variant, no user or background errors; the other variants are the frontier around them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import overload, stack
from bench.overload import CONFIG
from deployments.engine.llm_server import ObservedLLMServer
from tests.fakes.gpu_cost import H100_LLAMA_8B
from tests.fakes.gpu_steps import GPU_ENV, KV_TOKENS_ENV

PORT = 18250
FILL_S = 2.0  # background alone before the users start
P99_TARGET = 1.3
PAUSED = ": gps-paused"  # a paused stream's comment (policy/stream_migration.py pause_note)
BACKGROUND_TARGET = 0.5

# The embedded default's shape (ray_configs/local.yaml's orchestrator): its cap, more background
# streams than background's share of it holds, and its targets (issue 52).
EMBEDDED_CAP = 2
EMBEDDED_STREAMS = 6
EMBEDDED_P99_TARGET = 1.5
EMBEDDED_BACKGROUND_TARGET = 0.3  # of background alone
# The router's own queue (overload.yaml's short one would shed the waiting streams).
DEFAULT_QUEUE = {"max_queue": 64, "queue_timeout_s": 30.0}
DEFAULTS = "shares, preemption off (the defaults)"  # the variant judged; the rest: the frontier
GPU_MODEL = H100_LLAMA_8B.name  # tests/fakes/gpu_cost.py's shape
EngineKind = Literal["cpu", "gpu-model"]
ENGINES: tuple[EngineKind, ...] = get_args(EngineKind)


# A long answer, streamed (the users' request is the overload bench's).
BACKGROUND_BODY = {
    **overload.BODY,
    "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
    "max_tokens": 256,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@dataclass
class Phase(overload.Phase):
    """The overload bench's phase (its users, open loop, the same 16-token request), with what
    the background streams received and what pausing them cost."""

    background_tokens: int = 0
    background_answers: int = 0
    background_shed: int = 0  # 429 at admission (waited queue_timeout_s): no stream begun
    background_errors: int = 0  # any other status, or an error event in a stream
    pauses: float = 0.0
    reprefill_tokens: float = 0.0


def received(line: str, phase: Phase) -> None:
    """One line of a background stream, counted."""
    if '"error"' in line:
        phase.background_errors += 1
    elif line.startswith(PAUSED):  # counted where it happened, at any router
        phase.pauses += 1
    elif line.startswith("data: {"):
        chunk = json.loads(line[len("data: ") :])
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            phase.background_tokens += 1


async def background(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, phase: Phase
) -> None:
    """One closed-loop client streaming long answers until `stop`; every token it receives
    counts, the last answer's too."""
    while not stop.is_set():
        try:
            async with client.stream(
                "POST", url, json=BACKGROUND_BODY, headers={"X-Priority": "background"}
            ) as reply:
                if reply.status_code == 429:
                    phase.background_shed += 1
                    await asyncio.sleep(float(reply.headers.get("retry-after", "1")))
                    continue
                if reply.status_code != 200:
                    phase.background_errors += 1
                    await asyncio.sleep(1)
                    continue
                async for line in reply.aiter_lines():
                    received(line, phase)
                    if stop.is_set():
                        break
                else:
                    phase.background_answers += 1
        except httpx.HTTPError:
            phase.background_errors += 1


def preemption_counts(base_url: str) -> float:
    """The prompt tokens paused answers sent again so far, over every backend: the /metrics of
    the one router that answers the scrape (all of them with one ingress replica)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "gps_preempt_reprefill_tokens"
        for s in family.samples
        if s.name.endswith("_total")
    )


async def run_phase(
    variant: str,
    base_url: str,
    url: str,
    requests: int,
    streams: int,
    routers: int = 1,
    alone_s: float = 0.0,
    interval_s: float = overload.USER_INTERVAL_S,
) -> Phase:
    """Users alone (`streams` 0), or beside that many background streams, or (`requests` 0)
    the streams alone for `alone_s`; re-sent prompt tokens only where one router answers
    /metrics (`routers` 1)."""
    phase = Phase(variant, streams)
    # With several routers two scrapes may reach two of them: their difference says nothing.
    reprefill = preemption_counts(base_url) if routers == 1 else float("nan")
    limits = httpx.Limits(max_connections=streams + requests)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        stop = asyncio.Event()
        clients = [
            asyncio.create_task(background(client, url, stop, phase)) for _ in range(streams)
        ]
        started = time.perf_counter()
        if clients:
            await asyncio.sleep(FILL_S)
        if requests:
            await overload.user_stream(client, url, requests, phase, interval_s)
        else:  # background alone, as long as a user stream would take
            await asyncio.sleep(alone_s)
        stop.set()
        phase.seconds = time.perf_counter() - started
        await asyncio.gather(*clients)
    phase.reprefill_tokens = preemption_counts(base_url) - reprefill if routers == 1 else reprefill
    return phase


@dataclass(frozen=True)
class Engine:
    """What the backend runs: vLLM on this machine's CPU, or the test engine's model of a GPU
    under vLLM, its KV cache `kv_tokens` large (0: an H100's)."""

    kind: EngineKind = "cpu"
    kv_tokens: int = 0

    def caveat(self) -> str:
        """What every figure of a run was measured on."""
        if self.kind == "gpu-model":
            kv = f", its KV cache {self.kv_tokens} tokens" if self.kv_tokens else ""
            return f"a model of a GPU ({GPU_MODEL}{kv}, tests/fakes/gpu_cost.py), not a GPU"
        return "vLLM on this machine's CPU"


CPU = Engine()


def sized(cap: int, engine: Engine = CPU) -> dict[str, Any]:
    """The config's one model with a cap of `cap`, on `engine`."""
    [model] = yaml.safe_load(CONFIG.read_text())["models"]
    model = {**model, "max_concurrency": cap}
    if engine.kind == "gpu-model":
        env = {"RAYLLM_VLLM_ENGINE_CLS": "tests.fakes.tiny_engine.TinyEngine"}
        model["env_vars"] = {**env, GPU_ENV: GPU_MODEL}
        if engine.kv_tokens:
            model["env_vars"][KV_TOKENS_ENV] = str(engine.kv_tokens)
        model["cpus_per_replica"] = 0.01  # it computes nothing: the machine is the gateway's
    return {"models": [model]}


def variants(
    above_running: list[int], routers: int, resume_after: list[float] | None = None
) -> dict[str, Mapping[str, Any]]:
    """Preemption off, then on at each `above_running` and each hold-down (`resume_after`,
    seconds; 0: none). With several routers (ingress replicas), each on setting once more with
    `shared_slots` off: every router then weighs only what it runs itself (a user at one pauses
    nothing another runs), the anchor of what sharing the routers' work is worth."""
    gateway = {"ingress_replicas": routers}
    on: dict[str, Mapping[str, Any]] = {}
    for n in above_running:
        for hold in resume_after or [0.0]:
            name = f"preemption on, above_running {n}" + (
                f", resume_after_s {hold:g}" if hold else ""
            )
            preempt = {"router": {"preempt": {"enabled": True, "above_running": n,
                                              "resume_after_s": hold}}}  # fmt: skip
            on[name] = {**preempt, "gateway": gateway}
            if routers > 1:
                on[f"{name}, shared_slots off"] = {
                    **preempt,
                    "gateway": {**gateway, "shared_slots": False},
                }
    off = {"router": {"preempt": {"enabled": False}}, "gateway": gateway}
    return {"preemption off": off, **on}


async def measure(
    target: stack.Stage,
    cap: int,
    requests: int,
    above_running: list[int],
    routers: int,
    resume_after: list[float],
    engine: Engine = CPU,
) -> list[Phase]:
    phases = []
    streams = cap // 2  # the background share: admitted at once, never queued
    for name, overrides in variants(above_running, routers, resume_after).items():
        config = stack.load(CONFIG, {**sized(cap, engine), **overrides})
        stack.deploy_gateway(config, target.anchor)
        await run_phase("warm-up", target.base_url, target.gateway_url, 4, 0)
        for background_streams in (0, streams):
            phases.append(
                await run_phase(
                    name,
                    target.base_url,
                    target.gateway_url,
                    requests,
                    background_streams,
                    routers,
                )
            )
    return phases


def report(phases: list[Phase], engine: Engine = CPU) -> bool:
    print(f"engine: {engine.caveat()}\n")
    print(
        "| engine | variant | background | user n | user p50 ms | user p99 ms | p99 vs unloaded "
        "| user errors | background tokens/s | background answers | background 429 "
        "| background errors | pauses | re-sent prompt tokens |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    unloaded: dict[str, float] = {}
    loaded: dict[str, Phase] = {}
    ratios: dict[str, float] = {}
    for phase in phases:
        p99 = phase.percentile_ms(0.99)
        if phase.background_clients:
            loaded[phase.path] = phase
        else:
            unloaded[phase.path] = p99
        ratio = ratios[phase.path] = p99 / unloaded[phase.path]
        p50 = 1000 * statistics.median(phase.user_latencies_s) if phase.user_latencies_s else 0
        rate = phase.background_tokens / phase.seconds if phase.seconds else 0.0
        print(
            f"| {engine.kind} | {phase.path} | {'streams' if phase.background_clients else 'none'} "
            f"| {len(phase.user_latencies_s)} | {p50:.0f} | {p99:.0f} | {ratio:.2f} "
            f"| {phase.user_errors} | {rate:.1f} | {phase.background_answers} "
            f"| {phase.background_shed} | {phase.background_errors} | {phase.pauses:.0f} "
            f"| {phase.reprefill_tokens:.0f} |"
        )
    off, *ons = list(loaded.values())
    off_rate = off.background_tokens / off.seconds
    met = True
    for on in ons:
        share = (on.background_tokens / on.seconds) / off_rate if off_rate else float("nan")
        this = (
            ratios[on.path] <= P99_TARGET
            and on.user_errors == 0
            and on.background_errors == 0
            and share >= BACKGROUND_TARGET
        )
        met &= this
        print(
            f"\n{on.path}: user p99 loaded / unloaded {ratios[on.path]:.2f} (target <= "
            f"{P99_TARGET}; off: {ratios[off.path]:.2f}), user errors {on.user_errors}, "
            f"background errors {on.background_errors} (and {on.background_shed} shed with 429 "
            f"at admission), background tokens/s {share:.2f} x off's (target >= "
            f"{BACKGROUND_TARGET}); {on.pauses:.0f} pauses re-sent {on.reprefill_tokens:.0f} "
            f"prompt tokens: {'met' if this else 'NOT met'} (on {engine.caveat()})"
        )
    return met


def embedded_variants() -> dict[str, Mapping[str, Any]]:
    """Background over the whole cap (the anchor: what aged work took), then the shares as
    shipped with preemption off, and on with and without a hold-down."""
    whole_cap = {"class_shares": {"agent": 1.0, "background": 1.0}}
    on = {"enabled": True, "above_running": 1}
    variants: dict[str, Mapping[str, Any]] = {
        "background may fill the cap": {"router": {**DEFAULT_QUEUE, **whole_cap}},
        DEFAULTS: {"router": DEFAULT_QUEUE},
        "shares, preemption on, above_running 1": {"router": {**DEFAULT_QUEUE, "preempt": on}},
    }
    for hold in (0.5, 1.0):
        variants[f"shares, preemption on, above_running 1, resume_after_s {hold:g}"] = {
            "router": {**DEFAULT_QUEUE, "preempt": {**on, "resume_after_s": hold}}
        }
    return variants


async def measure_embedded(
    target: stack.Stage, requests: int, interval_s: float, engine: Engine = CPU
) -> list[Phase]:
    """Per variant: users alone, background alone, both (a user every `interval_s`)."""
    phases = []
    alone_s = requests * interval_s
    for name, overrides in embedded_variants().items():
        config = stack.load(CONFIG, {**sized(EMBEDDED_CAP, engine), **overrides})
        stack.deploy_gateway(config, target.anchor)
        base, url = target.base_url, target.gateway_url
        await run_phase("warm-up", base, url, 4, 0)
        users = await run_phase(name, base, url, requests, 0, interval_s=interval_s)
        alone = await run_phase(name, base, url, 0, EMBEDDED_STREAMS, alone_s=alone_s)
        both = await run_phase(name, base, url, requests, EMBEDDED_STREAMS, interval_s=interval_s)
        phases += [users, alone, both]
    return phases


def report_embedded(phases: list[Phase], engine: Engine = CPU) -> bool:
    print(f"engine: {engine.caveat()}\n")
    print(
        "| engine | variant | user p50 ms unloaded / loaded | user p99 ms unloaded / loaded "
        "| p99 ratio | background tokens/s alone / with users | ratio | user errors "
        "| background 429 | background errors | pauses |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    met = True
    for users, alone, both in zip(phases[::3], phases[1::3], phases[2::3], strict=True):
        p99 = both.percentile_ms(0.99) / users.percentile_ms(0.99)
        alone_rate = alone.background_tokens / alone.seconds
        rate = both.background_tokens / both.seconds
        share = rate / alone_rate if alone_rate else float("nan")
        errors = both.user_errors + both.background_errors
        this = p99 <= EMBEDDED_P99_TARGET and share >= EMBEDDED_BACKGROUND_TARGET and not errors
        if both.path == DEFAULTS:
            met = this
        p50s = [1000 * statistics.median(p.user_latencies_s) for p in (users, both)]
        print(
            f"| {engine.kind} | {both.path} | {p50s[0]:.0f} / {p50s[1]:.0f} "
            f"| {users.percentile_ms(0.99):.0f} / {both.percentile_ms(0.99):.0f} | {p99:.2f} "
            f"| {alone_rate:.1f} / {rate:.1f} | {share:.2f} | {both.user_errors} "
            f"| {both.background_shed} | {both.background_errors} | {both.pauses:.0f} |"
        )
    print(
        f"\ntargets: user p99 loaded / unloaded <= {EMBEDDED_P99_TARGET}, background tokens/s "
        f">= {EMBEDDED_BACKGROUND_TARGET} x alone, no errors (429s at admission apart): "
        f"{'met' if met else 'NOT met'} by the defaults; the other rows are the frontier "
        f"(on {engine.caveat()})"
    )
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.preemption")
    parser.add_argument("--requests", type=int, default=40, help="user requests per phase")
    parser.add_argument(
        "--above-running",
        default="1,2,3",
        help="router.preempt.above_running values to run with preemption on (comma separated)",
    )
    parser.add_argument("--cap", type=int, default=8, help="the backend's max_concurrency")
    parser.add_argument(
        "--ingress-replicas",
        type=int,
        default=1,
        help="routers (gateway.ingress_replicas); past 1, each preemption setting runs with "
        "shared_slots off too",
    )
    parser.add_argument(
        "--shape",
        choices=("inside", "embedded"),
        default="inside",
        help="inside: background fills its share of --cap (the variants above); embedded: the "
        "embedded default's cap 2 and six background streams, beside background over the cap",
    )
    parser.add_argument(
        "--user-interval",
        type=float,
        default=overload.USER_INTERVAL_S,
        help="--shape embedded: seconds between two users (0.5: the issue's; a machine whose "
        "engine takes longer than that for a user's answer alone queues users behind users)",
    )
    parser.add_argument(
        "--resume-after",
        default="0",
        help="router.preempt.resume_after_s values (the hold-down) to run each above_running "
        "with (comma separated; 0: none)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="cpu",
        help="cpu: vLLM on this machine; gpu-model: the test engine's model of a GPU under vLLM "
        "(tests/fakes/gpu_cost.py), each figure labelled so",
    )
    parser.add_argument(
        "--kv-tokens",
        type=int,
        default=0,
        help="--engine gpu-model: its KV cache's room in tokens (0: an H100's, about 448,000); "
        "less runs it out, where vLLM's scheduler preempts the lowest class itself",
    )
    args = parser.parse_args()
    embedded = args.shape == "embedded"
    cap = EMBEDDED_CAP if embedded else args.cap
    engine = Engine(args.engine, args.kv_tokens)
    target = stack.stage(CONFIG, PORT, sized(cap, engine), server_cls=ObservedLLMServer)
    try:
        above = [int(n) for n in args.above_running.split(",")]
        holds = [float(x) for x in args.resume_after.split(",")]
        phases = asyncio.run(
            measure_embedded(target, args.requests, args.user_interval, engine)
            if embedded
            else measure(
                target, args.cap, args.requests, above, args.ingress_replicas, holds, engine
            )
        )
    finally:
        stack.stop()
    sys.exit(0 if (report_embedded if embedded else report)(phases, engine) else 1)


if __name__ == "__main__":
    main()
