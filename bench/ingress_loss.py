"""What a client sees when the gateway's one ingress replica dies, and what it gets for a
request line no HTTP server can read, in each Ray Serve mode: the answers the front (Serve's
proxy, or HAProxy in the throughput mode) gives by itself, which our code never sees.

`python -m bench.ingress_loss [--modes default,throughput]`: bench/pace.py's stack (the
zero-cost engine, our gateway with a limited key) as a cluster of its own per mode; one client
sends whole chats back to back, the ingress replica is SIGKILLed after `--before` seconds, and
the client goes on until Serve's replacement has answered `--after-ok` in a row. Printed: every
status and content type seen, how long the answers were not 200, a body of each kind, and the
answer to a malformed request line. No target: it says what each mode does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from ray.util.state import list_actors

from bench import pace, stack

INGRESS = "SERVE_REPLICA::gateway#ingress"


@dataclass
class Seen:
    # (sent at, seconds taken, status, content type), times from the start
    answers: list[tuple[float, float, int, str]] = field(default_factory=list)
    bodies: dict[tuple[int, str], str] = field(default_factory=dict)
    killed_at: float | None = None


def ingress_pids() -> list[int]:
    return [
        int(actor["pid"])
        for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=1000)
        if (actor.get("name") or "").startswith(INGRESS) and actor.get("pid")
    ]


async def send(client: httpx.AsyncClient, seen: Seen, began: float) -> None:
    body, sent = pace.request_body(stream=False), time.monotonic()
    try:
        answer = await client.post("/v1/chat/completions", json=body)
        status, kind, text = (
            answer.status_code,
            answer.headers.get("content-type", "-"),
            answer.text,
        )
    except httpx.HTTPError as error:
        status, kind, text = 0, type(error).__name__, str(error)
    seen.answers.append((sent - began, time.monotonic() - sent, status, kind.split(";")[0]))
    seen.bodies.setdefault((status, kind.split(";")[0]), text[:300])


async def lose_the_ingress(base_url: str, before_s: float, after_ok: int, most_s: float) -> Seen:
    seen, began = Seen(), time.monotonic()
    headers = {"Authorization": f"Bearer {pace.API_KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        while time.monotonic() - began < before_s:
            await send(client, seen, began)
        victims = ingress_pids()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        seen.killed_at = time.monotonic() - began
        print(f"  killed the ingress replica (pids {victims}) at {seen.killed_at:.1f} s")
        in_a_row = 0
        while in_a_row < after_ok and time.monotonic() - began < most_s:
            await send(client, seen, began)
            in_a_row = in_a_row + 1 if seen.answers[-1][2] == 200 else 0
    return seen


def malformed_request_line(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        chunks = []
        try:
            while chunk := conn.recv(4096):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks).decode(errors="replace")


def report(mode: str, seen: Seen, garbled: str) -> None:
    after = [a for a in seen.answers if seen.killed_at is not None and a[0] >= seen.killed_at]
    bad = [a for a in after if a[2] != 200]
    print(f"\n### {mode}: {len(seen.answers)} requests, {len(after)} after the kill")
    print("| status | content type | count after the kill |\n|---|---|---:|")
    for (status, kind), count in sorted(Counter((a[2], a[3]) for a in after).items()):
        print(f"| {status} | {kind} | {count} |")
    if bad and seen.killed_at is not None:
        print(
            f"not 200 from {bad[0][0] - seen.killed_at:.2f} s to {bad[-1][0] - seen.killed_at:.2f}"
            " s after the kill"
        )
    slowest = max((a[1] for a in after), default=0.0)
    print(f"the longest a request took after the kill: {slowest:.2f} s")
    for (status, kind), text in sorted(seen.bodies.items()):
        if status != 200:
            print(f"  body of {status} {kind}: {text!r}")
    print(f"  a malformed request line gets: {garbled[:300]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(pace.MODES))
    parser.add_argument("--before", type=float, default=5.0)
    parser.add_argument("--after-ok", type=int, default=20)
    parser.add_argument("--most", type=float, default=180.0)
    args = parser.parse_args()
    for mode in args.modes.split(","):
        print(f"\n## mode: {mode} {pace.MODES[mode] or '(Ray Serve as installed)'}")
        os.environ.update(pace.MODES[mode])
        try:
            target = stack.stage(pace.CONFIG, pace.PORT)
            try:
                seen = asyncio.run(
                    lose_the_ingress(target.base_url, args.before, args.after_ok, args.most)
                )
                report(mode, seen, malformed_request_line(pace.PORT))
            finally:
                stack.stop()
        finally:
            for name in pace.MODES[mode]:
                os.environ.pop(name, None)


if __name__ == "__main__":
    main()
