"""Stored responses: the SQLite store (owner, retention, purge), the input items a response
keeps and their pages, and the ingress storing, continuing, showing and deleting responses
through the keeper's calls (deployments/ingress/responses)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.requests import Request

from core.config import hash_key, parse_config
from core.errors import ApiError, ErrorCode
from core.requests import ChatRequest
from deployments.ingress import app as ingress_app
from deployments.ingress.app import Ingress
from deployments.ingress.responses.conversation import input_items, page, with_ids
from deployments.ingress.responses.keeper import LocalKeeper, ResponseKeeper
from deployments.ingress.responses.store import ResponseStore, StoredResponse
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from tests.fakes import serve_handle
from tests.fakes.clock import FakeClock
from tests.fakes.http_request import keyed_request, response_text

DAY = 24 * 3600.0


def stored(rid: str, owner: str = "a") -> StoredResponse:
    response = {"id": rid, "object": "response", "output": [{"id": "o", "type": "message"}]}
    return StoredResponse(rid, owner, response, [{"id": "i", "type": "message"}])


def test_a_response_is_found_by_its_owner_alone_until_it_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    store = ResponseStore(tmp_path / "r" / "db.sqlite3", "app", clock)
    kept = store.put(stored("resp_1"), DAY)
    assert kept is not None
    assert (kept.created_at, kept.expires_at) == (1_000.0, 1_000.0 + DAY)
    found = store.find("resp_1", "a")
    assert found is not None
    assert found.response == stored("resp_1").response
    assert found.conversation() == [{"id": "i", "type": "message"}, {"id": "o", "type": "message"}]
    assert store.find("resp_1", "b") is None  # another key's: as if it never was
    assert not store.delete("resp_1", "b")
    assert store.put(stored("resp_1", owner="b"), DAY) is None  # never another key's row
    assert store.find("resp_1", "a") == found
    clock.now += 1
    assert store.put(stored("resp_1"), 5.0) is not None  # the owner's retried write
    clock.now += 5
    assert store.find("resp_1", "a") is None
    assert not store.delete("resp_1", "a")
    assert store.purge() == 1


def test_responses_outlive_the_store_that_wrote_them_and_apps_do_not_share(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    file = tmp_path / "db.sqlite3"
    first = ResponseStore(file, "app", clock)
    first.put(stored("resp_1"), DAY)
    first.close()
    assert ResponseStore(file, "app", clock).find("resp_1", "a") is not None
    assert ResponseStore(file, "other", clock).find("resp_1", "a") is None


def test_the_keeper_purges_expired_responses_as_it_puts_at_most_once_a_minute(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    local = LocalKeeper(ResponseKeeper("app", str(tmp_path / "db.sqlite3"), clock))
    assert asyncio.run(local.put(stored("resp_1"), 10.0))
    clock.now += 11
    asyncio.run(local.put(stored("resp_2"), 10.0))  # within the minute: no purge yet
    store = ResponseStore(tmp_path / "db.sqlite3", "app", clock)
    assert store.purge() == 1  # resp_1 was still there, expired
    asyncio.run(local.put(stored("resp_3"), 10.0))
    clock.now += 60
    asyncio.run(local.put(stored("resp_4"), 10.0))  # a purge: resp_2 and resp_3 expired
    assert store.purge() == 0
    assert not asyncio.run(local.put(stored("resp_4", owner="b"), 10.0))
    assert asyncio.run(local.find("resp_4", "a")) is not None
    assert asyncio.run(local.delete("resp_4", "a"))
    assert asyncio.run(local.find("resp_4", "a")) is None


def test_input_is_kept_as_items_with_ids_and_text_parts() -> None:
    items = input_items("Hi")
    assert items == [{"type": "message", "role": "user", "content": "Hi"}]
    call = {"type": "function_call_output", "call_id": "c", "output": "42", "id": "fco_1"}
    kept = with_ids([*items, {"role": "assistant", "content": "Yes"}, call], "resp_x")
    assert kept[0] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hi"}],
        "status": "completed",
        "id": "msg_x_in0",
    }
    assert kept[1]["content"] == [{"annotations": [], "type": "output_text", "text": "Yes"}]
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}
    assert with_ids([image], "resp_x")[0]["content"][0]["detail"] == "auto"
    assert kept[2] == call  # its own id stays
    bad: Any
    for bad in (None, [], 3, {"role": "user"}):
        with pytest.raises(ApiError) as refused:
            input_items(bad)
        assert refused.value.param == "input"


def test_input_items_come_in_pages_newest_first_unless_asked() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    first = page(items, {"limit": "2"})
    assert [i["id"] for i in first["data"]] == ["i4", "i3"]
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("i4", "i3", True)
    rest = page(items, {"limit": "2", "after": "i3"})
    assert [i["id"] for i in rest["data"]] == ["i2", "i1"]
    last = page(items, {"order": "asc", "after": "i3"})
    assert ([i["id"] for i in last["data"]], last["has_more"]) == (["i4"], False)
    empty = page([], {})
    assert (empty["data"], empty["first_id"], empty["has_more"]) == ([], None, False)
    for query, param in (
        ({"order": "up"}, "order"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after": "nope"}, "after"),
    ):
        with pytest.raises(ApiError) as refused:
            page(items, query)
        assert (refused.value.status, refused.value.param) == (400, param)


# --- through the ingress, with a router that answers like an engine ------------------------------

E2E = Path(__file__).parents[1] / "e2e"
KEYS = {"one": "unit-key-one", "two": "unit-key-two"}


class BrokenKeeper:
    async def put(self, stored: StoredResponse, retention_s: float) -> bool:
        raise ConnectionError("gone")

    async def find(self, response_id: str, owner: str) -> StoredResponse | None:
        raise ConnectionError("gone")

    async def delete(self, response_id: str, owner: str) -> bool:
        raise ConnectionError("gone")


def ingress_of(
    router: serve_handle.EngineLikeRouter, tmp_path: Path, keeper: Any = None
) -> Ingress:
    raw = yaml.safe_load((E2E / "gateway.yaml").read_text())
    raw["api_keys"] = [{"name": name, "sha256": hash_key(key)} for name, key in KEYS.items()]
    config = parse_config(raw, base_dir=E2E, environ={})
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))
    keeper = keeper or LocalKeeper(ResponseKeeper("unit", str(tmp_path / "r.sqlite3")))
    return Ingress(config, router, lambda: ledger, responses=lambda: keeper)


def request(method: str, path: str, key: str = "one", body: Any = None, query: str = "") -> Request:
    return keyed_request(KEYS[key], method, path, body, query)


def respond(ingress: Ingress, body: dict[str, Any], key: str = "one") -> dict[str, Any]:
    response = asyncio.run(ingress.responses(request("POST", "/v1/responses", key, body)))
    text = asyncio.run(response_text(response))
    if body.get("stream"):
        events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        return dict(events[-1]["response"])
    return dict(json.loads(text))


def test_a_stored_response_is_continued_shown_listed_and_deleted(tmp_path: Path) -> None:
    router = serve_handle.EngineLikeRouter()
    ingress = ingress_of(router, tmp_path)
    first = respond(ingress, {"model": "orchestrator", "input": "Hi", "instructions": "Be brief"})
    assert first["store"] is True
    rid = first["id"]
    # The ingress's own, random: a completion's id may be the client's X-Request-ID.
    assert rid.startswith("resp_")
    assert rid.removeprefix("resp_") not in json.dumps(router.jobs[-1].request.model_dump())
    # Streamed, continuing the first: the whole conversation reaches the model, not the
    # instructions (the Responses API does not carry them over).
    second = respond(
        ingress,
        {"model": "orchestrator", "input": "Again", "previous_response_id": rid, "stream": True},
    )
    assert second["previous_response_id"] == rid
    sent = router.jobs[-1].request
    assert isinstance(sent, ChatRequest)
    messages = sent.messages
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "Hi"),
        ("assistant", "Hi."),
        ("user", "Again"),
    ]
    shown = asyncio.run(ingress.stored_response(second["id"], request("GET", "/")))
    assert json.loads(bytes(shown.body)) == second
    asked = request("GET", "/", query="order=asc")
    listed = asyncio.run(ingress.response_input(second["id"], asked))
    items = json.loads(bytes(listed.body))["data"]
    assert [(i["type"], i.get("role")) for i in items] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert items[1]["id"] == first["output"][0]["id"]
    # Another key finds neither, and cannot delete or continue it.
    others: list[Coroutine[Any, Any, Any]] = [
        ingress.stored_response(rid, request("GET", "/", "two")),
        ingress.delete_response(rid, request("DELETE", "/", "two")),
    ]
    for call in others:
        with pytest.raises(ApiError) as refused:
            asyncio.run(call)
        assert (refused.value.status, refused.value.code) == (404, ErrorCode.NOT_FOUND)
    body = {"model": "orchestrator", "input": "x", "previous_response_id": rid}
    with pytest.raises(ApiError) as refused:
        respond(ingress, body, "two")
    assert (refused.value.status, refused.value.param) == (400, "previous_response_id")
    assert refused.value.code == ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND
    deleted = asyncio.run(ingress.delete_response(rid, request("DELETE", "/")))
    assert json.loads(bytes(deleted.body)) == {"id": rid, "object": "response", "deleted": True}
    with pytest.raises(ApiError):
        asyncio.run(ingress.stored_response(rid, request("GET", "/")))


def test_store_false_keeps_nothing_and_a_bad_previous_id_is_a_400(tmp_path: Path) -> None:
    ingress = ingress_of(serve_handle.EngineLikeRouter(), tmp_path)
    answer = respond(ingress, {"model": "orchestrator", "input": "Hi", "store": False})
    assert answer["store"] is False
    with pytest.raises(ApiError) as refused:
        asyncio.run(ingress.stored_response(answer["id"], request("GET", "/")))
    assert refused.value.status == 404
    with pytest.raises(ApiError) as refused:
        respond(ingress, {"model": "orchestrator", "input": "Hi", "previous_response_id": 7})
    assert (refused.value.status, refused.value.param) == (400, "previous_response_id")
    with pytest.raises(ApiError) as refused:
        respond(ingress, {"model": "orchestrator", "input": "Hi", "store": "false"})
    assert (refused.value.status, refused.value.param) == (400, "store")


def test_a_store_that_cannot_be_reached_costs_the_answer_nothing(tmp_path: Path) -> None:
    ingress = ingress_of(serve_handle.EngineLikeRouter(), tmp_path, BrokenKeeper())
    for stream in (False, True):
        answer = respond(ingress, {"model": "orchestrator", "input": "Hi", "stream": stream})
        assert answer["status"] == "completed"
    with pytest.raises(ApiError) as refused:
        respond(ingress, {"model": "orchestrator", "input": "x", "previous_response_id": "resp_1"})
    assert (refused.value.status, refused.value.code) == (503, ErrorCode.STORE_UNAVAILABLE)


class HangingKeeper(BrokenKeeper):
    """An actor Ray holds calls for while it restarts."""

    async def find(self, response_id: str, owner: str) -> StoredResponse | None:
        await asyncio.sleep(3600)
        return None


def test_a_keeper_that_does_not_answer_is_a_503_within_the_keepers_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingress_app, "KEEPER_TIMEOUT_S", 0.05)
    ingress = ingress_of(serve_handle.EngineLikeRouter(), tmp_path, HangingKeeper())
    with pytest.raises(ApiError) as refused:
        asyncio.run(ingress.stored_response("resp_1", request("GET", "/")))
    assert (refused.value.status, refused.value.code) == (503, ErrorCode.STORE_UNAVAILABLE)
    assert refused.value.headers["Retry-After"] == "5"


def test_truncation_disabled_reaches_the_router_and_absent_is_auto(tmp_path: Path) -> None:
    router = serve_handle.EngineLikeRouter()
    ingress = ingress_of(router, tmp_path)
    plain = respond(ingress, {"model": "orchestrator", "input": "Hi"})
    assert (plain["truncation"], router.jobs[-1].truncate) == ("auto", True)
    body = {"model": "orchestrator", "input": "Hi", "truncation": "disabled"}
    assert respond(ingress, body)["truncation"] == "disabled"
    assert router.jobs[-1].truncate is False
    with pytest.raises(ApiError) as refused:
        respond(ingress, {**body, "truncation": "middle"})
    assert (refused.value.status, refused.value.param) == (400, "truncation")
