"""The event webhook against a real local HTTP server: in order, retried, never blocking."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from autoscale.webhook import WebhookSender


class Receiver:
    """Answers each POST with the next status of `statuses` (then 200); keeps what arrived."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.received: list[tuple[int, dict[str, Any]]] = []
        self.stall = threading.Event()
        self.stall.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.stall.wait(10)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.received.append((status, body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stall.set()
        self.server.shutdown()
        self.server.server_close()


MakeReceiver = Callable[[list[int]], Receiver]


@pytest.fixture
def receiver() -> Iterator[MakeReceiver]:
    made: list[Receiver] = []

    def make(statuses: list[int]) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for r in made:
        r.close()


async def no_wait(_: float) -> None:
    await asyncio.sleep(0)


async def drained(sender: WebhookSender) -> None:
    for _ in range(500):
        if sender.pending == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("events still pending")


def test_events_arrive_once_in_order_after_retries(receiver: MakeReceiver) -> None:
    server = receiver([503, 503])

    async def scenario() -> None:
        sender = WebhookSender(server.url, sleep=no_wait)
        for n in range(3):
            sender.send({"type": "POOL_DRAINING", "seq": n})
        await drained(sender)
        await sender.aclose()

    asyncio.run(scenario())
    delivered = [body["seq"] for status, body in server.received if status == 200]
    assert delivered == [0, 1, 2]
    assert [s for s, _ in server.received] == [503, 503, 200, 200, 200]


def test_a_client_error_is_not_retried(receiver: MakeReceiver) -> None:
    server = receiver([400])

    async def scenario() -> None:
        sender = WebhookSender(server.url, sleep=no_wait)
        sender.send({"seq": 0})
        sender.send({"seq": 1})
        await drained(sender)
        await sender.aclose()

    asyncio.run(scenario())
    assert [(s, b["seq"]) for s, b in server.received] == [(400, 0), (200, 1)]


def test_send_never_waits_for_the_receiver(receiver: MakeReceiver) -> None:
    server = receiver([])
    server.stall.clear()  # the receiver hangs

    async def scenario() -> int:
        sender = WebhookSender(server.url, sleep=no_wait, max_pending=3)
        for n in range(10):
            sender.send({"seq": n})  # returns at once, whatever the receiver does
        pending = sender.pending
        server.stall.set()
        await drained(sender)
        await sender.aclose()
        return pending

    assert asyncio.run(scenario()) <= 3  # the oldest were dropped, with a warning
    assert [b["seq"] for _, b in server.received][-3:] == [7, 8, 9]


def test_an_unreachable_receiver_is_given_up_after_the_attempts() -> None:
    async def scenario() -> int:
        sender = WebhookSender("http://127.0.0.1:9/events", attempts=3, sleep=no_wait)
        sender.send({"seq": 0})
        await drained(sender)
        await sender.aclose()
        return sender.pending

    assert asyncio.run(scenario()) == 0
