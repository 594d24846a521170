"""Aged background work never takes the users' headroom (issue 52), on a real engine.

coding@local (vLLM, cap 2 like the embedded default's orchestrator; background's share is one
slot) gets more background streams than that share holds, for several aging steps
(`router.aging_s` shortened by a reload for the test), while users keep arriving. Aging orders
the waiters, but a background request never holds more than background's share however long it
waited: what the router records (`/v1/cluster/status`: seats by class, the most each class held
at once) shows background never held the slot the share leaves to users, every user was
served, and background answers kept finishing throughout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.reload import ServeApp, reload
from tests.waiting import wait_for

API_KEY = "test-user-key"  # tester: agent by default, may claim user
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
BACKEND = "coding@local"
AGING_S = 0.5  # a waiter ranks as a user after 1 s: every queued background request does
BACKGROUND_CLIENTS = 4  # three more than background's one slot
ANSWERS_EACH = 3
USERS = 10
USER_INTERVAL_S = 0.4


def serving(gateway: str) -> bool:
    """coding@local's engine runs and takes work: an earlier test may have killed every
    engine, and until Serve replaced it coding's requests go to the CPU fallback."""
    backend = backend_status(gateway)
    return bool(backend["state"] == "up" and backend["breaker"] == "closed")


@pytest.fixture
def quick_aging(gateway: str) -> Iterator[None]:
    """`router.aging_s` shortened by a reload (applied in place), as before again after;
    coding@local serving first."""
    wait_for(lambda: serving(gateway), 900, f"{BACKEND} up with its breaker closed")
    app = ServeApp("gateway")
    before = app.running().config
    router = before.router.model_copy(update={"aging_s": AGING_S})
    assert reload(before.model_copy(update={"router": router}), app) is not None
    try:
        yield
    finally:
        reload(before, app)


def chat(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "coding",
        "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def backend_status(gateway: str) -> dict[str, Any]:
    status = httpx.get(f"{gateway}/v1/cluster/status", headers=HEADERS, timeout=30).json()
    backend: dict[str, Any] = status["backends"][BACKEND]
    return backend


def background_waits_past_two_steps(gateway: str) -> float:
    """Background requests that waited for a slot longer than two aging steps, so far (the
    router's wait histogram: its bucket at 1 s is two steps of AGING_S)."""
    text = httpx.get(f"{gateway}/metrics", headers=HEADERS, timeout=30).text
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "gps_queue_wait_seconds"
        for s in family.samples
        if s.labels.get("priority") == "background"
    }
    count = samples.get(("gps_queue_wait_seconds_count", None), 0.0)
    return count - samples.get(("gps_queue_wait_seconds_bucket", "1.0"), 0.0)


async def load(gateway: str) -> tuple[list[int], list[str]]:
    """Background streams beyond their share and a user every USER_INTERVAL_S; the users'
    statuses, and each background answer's last line."""
    endings: list[str] = []
    async with httpx.AsyncClient(base_url=gateway, headers=HEADERS, timeout=300) as client:

        async def background() -> None:
            for _ in range(ANSWERS_EACH):
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=chat(32, stream=True),
                    headers={"X-Priority": "background"},
                ) as reply:
                    lines = [line async for line in reply.aiter_lines() if line]
                endings.append(f"{reply.status_code} {lines[-1] if lines else ''}")

        async def user(delay_s: float) -> int:
            await asyncio.sleep(delay_s)
            reply = await client.post(
                "/v1/chat/completions", json=chat(8, stream=False), headers={"X-Priority": "user"}
            )
            return reply.status_code

        streams = [asyncio.create_task(background()) for _ in range(BACKGROUND_CLIENTS)]
        # The users start once background waiters have aged past every class (two steps).
        start_s = 4 * AGING_S
        users = await asyncio.gather(*(user(start_s + i * USER_INTERVAL_S) for i in range(USERS)))
        await asyncio.gather(*streams)
    return list(users), endings


def test_aged_background_work_never_takes_the_slot_its_share_leaves_to_users(
    gateway: str, quick_aging: None
) -> None:
    before = backend_status(gateway)
    assert before["share_slots"] == {"user": 2, "agent": 1, "background": 1}
    aged_before = background_waits_past_two_steps(gateway)
    users, endings = asyncio.run(load(gateway))
    after = backend_status(gateway)

    assert users == [200] * USERS
    assert endings == ["200 data: [DONE]"] * (BACKGROUND_CLIENTS * ANSWERS_EACH)
    seats = {c: after["seats_by_priority"][c] - before["seats_by_priority"][c] for c in after[
        "seats_by_priority"]}  # fmt: skip
    assert seats["user"] >= USERS
    assert seats["background"] >= BACKGROUND_CLIENTS * ANSWERS_EACH
    # Background requests did wait past two aging steps (ranking as users by then)...
    assert background_waits_past_two_steps(gateway) > aged_before
    # ...and the router's record says background (counted with nothing below it) never held
    # more than its one slot: no user waited for a slot background held past its share.
    assert after["most_held"]["background"] <= after["share_slots"]["background"]
