"""What the Responses and Messages APIs' translations cost the gateway, beside chat's, in one run.

bench.pace's stack (the test engine at GPU pace behind our gateway, keys and every limit on):
the same request sent as chat (`/v1/chat/completions`), as a response (`/v1/responses`) and as
a message (`/v1/messages`), whole and streamed, in rotating rounds at 1, 8 and 32 clients. Each
is the very same job in the router; the translation at the edge (the request into the job, the
answer or stream back) is the difference. Printed: requests/s, p50, errors and the front's CPU
per request (proxy, ingress replica, key ledger, slot broker), with each API's ratio to chat's.
On a 2-core machine those ratios move by a quarter between rounds, so the translation is also
timed alone, in this process: one chat stream and one whole chat answer recorded from the
gateway in this run, translated into each API (the request into the chat job, the answer or
stream back) a few thousand times, against chat's front CPU per request measured beside it.
Target (issue 53): the translation adds at most 10% of the front's CPU per request.

    python -m bench.translation [--rounds N] [--scale F]     # in `make bench`
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench import pace, stack
from deployments.ingress.anthropic.answer import to_message
from deployments.ingress.anthropic.events import MessageEvents
from deployments.ingress.anthropic.request import to_chat as message_to_chat
from deployments.ingress.responses.answer import to_response
from deployments.ingress.responses.events import ResponseEvents
from deployments.ingress.responses.request import to_chat as response_to_chat

APIS = ("chat", "responses", "messages", "responses-stored")
TRANSLATED = ("responses", "messages")  # held to the target; storing is work of its own
CLIENTS = (1, 8, 32)
WHOLE_REQUESTS = {1: 300, 8: 800, 32: 1600}
STREAMS = {1: 60, 8: 240, 32: 480}
CPU_RATIO = 1.10  # of chat's front CPU per request
ALONE_REPEATS = 2000  # translations timed in this process, per API and kind


def by_api(paces: list[pace.Route]) -> list[pace.Route]:
    """bench.pace's gateway path, once for each API."""
    [gateway] = [r for r in paces if r.name == "(b) gateway"]
    return [pace.Route(api, gateway.base, gateway.headers, gateway.front, api=api) for api in APIS]


async def measure(
    routes: list[pace.Route], rounds: int, scale: float
) -> dict[tuple[str, bool, int], pace.Run]:
    await pace.warm(routes)
    return await pace.rotated(routes, rounds, scale, CLIENTS, WHOLE_REQUESTS, STREAMS)


@dataclass(frozen=True)
class Recorded:
    """What the gateway's chat answered in this run: one stream's text as the ingress relays it
    (each piece as it came) and one whole answer's body."""

    stream: list[str]
    whole: dict[str, Any]


async def record(chat: pace.Route) -> Recorded:
    url = f"{chat.base}{pace.API_PATHS['chat']}"
    async with httpx.AsyncClient(timeout=60) as client:
        reply = await client.post(url, json=pace.request_body(False), headers=chat.headers)
        reply.raise_for_status()
        body = pace.request_body(True)
        async with client.stream("POST", url, json=body, headers=chat.headers) as streamed:
            streamed.raise_for_status()
            pieces = [piece async for piece in streamed.aiter_text()]
    return Recorded(pieces, reply.json())


def _responses(recorded: Recorded, stream: bool) -> None:
    body = pace.request_body(stream, "responses")
    job = response_to_chat(body)
    if not stream:
        to_response(recorded.whole, body, job.names, "resp_bench")
        return
    events = ResponseEvents(body, job.names, "resp_bench")
    for piece in recorded.stream:
        events.feed(piece)
    events.end()


def _messages(recorded: Recorded, stream: bool) -> None:
    body = pace.request_body(stream, "messages")
    message_to_chat(body)
    if not stream:
        to_message(recorded.whole, body["model"])
        return
    events = MessageEvents(body["model"], 20)
    for piece in recorded.stream:
        events.feed(piece)
    events.end()


TRANSLATIONS: dict[str, Callable[[Recorded, bool], None]] = {
    "responses": _responses,
    "messages": _messages,
}


def alone_ms(recorded: Recorded) -> dict[tuple[str, bool], float]:
    """CPU ms of one request's translation, by (API, streamed), timed in this process."""
    spent: dict[tuple[str, bool], float] = {}
    for api, translate in TRANSLATIONS.items():
        for stream in (False, True):
            translate(recorded, stream)  # imports and caches warm
            started = time.process_time()
            for _ in range(ALONE_REPEATS):
                translate(recorded, stream)
            spent[(api, stream)] = (time.process_time() - started) * 1000 / ALONE_REPEATS
    return spent


def report_alone(
    alone: dict[tuple[str, bool], float], runs: dict[tuple[str, bool, int], pace.Run]
) -> bool:
    """Each translation's own CPU against chat's front CPU per request at each level."""
    met = True
    print("\nthe translation alone (this process, on this run's recorded chat answers):")
    print("| API | kind | translation CPU ms/req | chat front CPU ms/req (fewest) | added |")
    print("|---|---|---:|---:|---:|")
    for (api, stream), ms in alone.items():
        chat = min(
            runs[("chat", stream, c)].cpu_ms(runs[("chat", stream, c)].front_cpu_s) for c in CLIENTS
        )
        added = ms / chat
        met &= added <= CPU_RATIO - 1
        kind = f"stream of {pace.STREAM_TOKENS} tokens" if stream else "whole"
        print(f"| {api} | {kind} | {ms:.3f} | {chat:.2f} | {added:.1%} |")
    print(f"target (issue 53): each adds <= {CPU_RATIO - 1:.0%}: {'met' if met else 'NOT met'}")
    return met


def report(routes: list[pace.Route], runs: dict[tuple[str, bool, int], pace.Run]) -> bool:
    """Print every cell; True when no request failed."""
    answered = cells = True
    for stream in (False, True):
        what = f"streams of {pace.STREAM_TOKENS} tokens" if stream else "whole requests"
        print(f"\n{what}, the same job through each API:")
        print("| API | clients | req/s | p50 ms | errors | front CPU ms/req | ratio to chat |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for clients in CLIENTS:
            chat = runs[("chat", stream, clients)]
            chat_cpu = chat.cpu_ms(chat.front_cpu_s)
            for path in routes:
                r = runs[(path.name, stream, clients)]
                cpu = r.cpu_ms(r.front_cpu_s)
                print(
                    f"| {path.name} | {clients} | {r.per_s:.0f} | {r.p(0.5):.2f} | {r.errors} "
                    f"| {cpu:.2f} | {cpu / chat_cpu:.2f} |"
                )
                answered &= r.errors == 0
                if path.name in TRANSLATED:
                    cells &= cpu <= CPU_RATIO * chat_cpu
    ratios = [
        runs[(api, stream, clients)].front_cpu_s / runs[("chat", stream, clients)].front_cpu_s
        for api in TRANSLATED
        for stream in (False, True)
        for clients in CLIENTS
    ]
    print(
        f"\nmedian front CPU ratio to chat (responses, messages): {statistics.median(ratios):.2f}"
    )
    target = f"each of {', '.join(TRANSLATED)} <= {CPU_RATIO:.2f} x chat in every cell"
    print(f"through the gateway, {target}: {'yes' if cells else 'no'}")
    print(f"every request answered: {'yes' if answered else 'NO'}")
    return answered


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.translation")
    parser.add_argument("--rounds", type=int, default=2, help="rotating rounds per level")
    parser.add_argument("--scale", type=float, default=1.0, help="of each level's requests")
    args = parser.parse_args()
    routes = by_api(pace.deploy())
    try:
        runs = asyncio.run(measure(routes, args.rounds, args.scale))
        recorded = asyncio.run(record(routes[0]))
        answered = report(routes, runs)
        met = report_alone(alone_ms(recorded), runs) and answered
    finally:
        stack.stop()
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
