"""What the Responses and Messages APIs' translations cost the gateway, beside chat's, in one run.

bench.pace's stack (the test engine at GPU pace behind our gateway, keys and every limit on):
the same request sent as chat (`/v1/chat/completions`), as a response (`/v1/responses`) and as
a message (`/v1/messages`), whole and streamed, in rotating rounds at 1, 8 and 32 clients. Each
is the very same job in the router; the translation at the edge (the request into the job, the
answer or stream back) is the difference. Printed: requests/s, p50, errors and the front's CPU
per request (proxy, ingress replica, key ledger, slot broker), with each API's ratio to chat's.
Target (issue 53): the translation adds at most 10% of the front's CPU per request.

    python -m bench.translation [--rounds N] [--scale F]     # in `make bench`
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys

from bench import pace, stack

APIS = ("chat", "responses", "messages", "responses-stored")
TRANSLATED = ("responses", "messages")  # held to the target; storing is work of its own
CLIENTS = (1, 8, 32)
WHOLE_REQUESTS = {1: 300, 8: 800, 32: 1600}
STREAMS = {1: 60, 8: 240, 32: 480}
CPU_RATIO = 1.10  # of chat's front CPU per request


def by_api(paces: list[pace.Route]) -> list[pace.Route]:
    """bench.pace's gateway path, once for each API."""
    [gateway] = [r for r in paces if r.name == "(b) gateway"]
    return [pace.Route(api, gateway.base, gateway.headers, gateway.front, api=api) for api in APIS]


async def measure(
    routes: list[pace.Route], rounds: int, scale: float
) -> dict[tuple[str, bool, int], pace.Run]:
    await pace.warm(routes)
    return await pace.rotated(routes, rounds, scale, CLIENTS, WHOLE_REQUESTS, STREAMS)


def report(routes: list[pace.Route], runs: dict[tuple[str, bool, int], pace.Run]) -> bool:
    met = True
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
                met &= r.errors == 0
                if path.name in TRANSLATED:
                    met &= cpu <= CPU_RATIO * chat_cpu
    ratios = [
        runs[(api, stream, clients)].front_cpu_s / runs[("chat", stream, clients)].front_cpu_s
        for api in TRANSLATED
        for stream in (False, True)
        for clients in CLIENTS
    ]
    print(
        f"\nmedian front CPU ratio to chat (responses, messages): {statistics.median(ratios):.2f}"
    )
    target = f"each of {', '.join(TRANSLATED)} <= {CPU_RATIO:.2f} x chat"
    print(f"target (issue 53): {target}: {'met' if met else 'NOT met'}")
    return met


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m bench.translation")
    parser.add_argument("--rounds", type=int, default=2, help="rotating rounds per level")
    parser.add_argument("--scale", type=float, default=1.0, help="of each level's requests")
    args = parser.parse_args()
    routes = by_api(pace.deploy())
    try:
        runs = asyncio.run(measure(routes, args.rounds, args.scale))
        met = report(routes, runs)
    finally:
        stack.stop()
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
