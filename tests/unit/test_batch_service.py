"""The Batch API's service on a real SQLite store in a temporary directory, with a gateway the
test holds: files checked line by line, batches run in chunks and committed, resumed after a
crash with nothing lost or run twice, cancelled, expired."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from core.config import BatchConfig
from deployments.batch.ports import Answer, Unreachable
from deployments.batch.service import BatchService
from deployments.batch.store import BatchStore, ChunkResult

SETTINGS = BatchConfig(chunk_rounds=2, max_chunk=8, retry_pause_s=0.01)
OWNER = "alice"


class FakeGateway:
    """Answers each line by its body: `fail` -> 400, `busy` -> 429 once, else 200."""

    def __init__(self, slots: int = 2) -> None:
        self.slots = slots
        self.sent: list[str] = []
        self.busy_seen: set[str] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold_after: int | None = None  # calls past this many hang until released
        self.calls = 0
        self.release = asyncio.Event()
        self._answered = asyncio.Event()
        self.unreachable = 0

    async def answer(self, endpoint: str, body: dict[str, Any], owner: str) -> Answer:
        tag = body["messages"][0]["content"]
        if self.unreachable:
            self.unreachable -= 1
            raise Unreachable("the app is restarting")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.calls += 1
            if self.hold_after is not None and self.calls > self.hold_after:
                await self.release.wait()
            await asyncio.sleep(0)
            if tag.startswith("busy") and tag not in self.busy_seen:
                self.busy_seen.add(tag)
                return Answer(429, {"error": {"message": "shed"}}, retry_after_s=0.01)
            self.sent.append(tag)
            self._answered.set()
            if tag.startswith("fail"):
                return Answer(400, {"error": {"message": "bad", "code": "invalid_request"}})
            reply = {"object": "chat.completion", "choices": [{"message": {"content": tag}}]}
            return Answer(200, reply, request_id=f"req-{tag}", usage=(3, 2))
        finally:
            self.in_flight -= 1

    async def background_slots(self, model: str) -> int:
        return self.slots

    async def until_sent(self, count: int) -> None:
        while len(self.sent) < count:
            self._answered.clear()
            await self._answered.wait()


def line(custom_id: str, content: str | None = None, **overrides: Any) -> dict[str, Any]:
    body = {"model": "coding", "messages": [{"role": "user", "content": content or custom_id}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": body, **overrides}  # fmt: skip


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(entry).encode() + b"\n" for entry in lines)


def make_service(directory: Path, gateway: FakeGateway, clock: Any = None) -> BatchService:
    store = BatchStore(directory)
    kwargs = {"clock": clock} if clock else {}
    return BatchService(store, gateway, SETTINGS, max_json_depth=64, **kwargs)


def upload(service: BatchService, data: bytes, part: int = 7) -> tuple[int, dict[str, Any]]:
    upload_id = service.upload_begin(OWNER, "input.jsonl", "batch")
    for start in range(0, len(data), part):  # small parts: lines cross them
        service.upload_part(upload_id, data[start : start + part])
    return service.upload_end(upload_id)


def content(service: BatchService, file_id: str) -> list[dict[str, Any]]:
    data = b""
    while True:  # part by part, as the ingress streams it
        status, part = service.content_part(OWNER, file_id, len(data))
        assert status == 200, part
        if not part:
            return [json.loads(text) for text in data.decode().splitlines()]
        data += part


def run(service: BatchService, body: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        status, batch = service.create(OWNER, body)
        assert status == 200, batch
        await service.wait(batch["id"])
        return service.batch(OWNER, batch["id"])[1]

    return asyncio.run(go())


def create_body(file_id: str) -> dict[str, Any]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h", "metadata": {"job": "eval"}}  # fmt: skip


def test_a_file_with_bad_lines_is_refused_naming_each_line(tmp_path: Path) -> None:
    service = make_service(tmp_path, FakeGateway())
    lines = [line("a"), line("a"), line("b", method="GET"), line("c", url="/v1/images")]
    data = jsonl(lines) + b"{not json\n" + b'["a list"]\n'
    status, body = upload(service, data)
    assert status == 400
    message = body["error"]["message"]
    for expected in ("line 2: custom_id 'a' is repeated", "line 3: method must be POST",
                     "line 4: url must be one of", "line 5: not a JSON object",
                     "line 6: not a JSON object"):  # fmt: skip
        assert expected in message
    assert service.files(OWNER)[1]["data"] == []  # nothing kept
    assert list((tmp_path / "uploads").iterdir()) == []


def test_a_batch_runs_every_line_once_in_order_and_bad_bodies_go_to_the_error_file(
    tmp_path: Path,
) -> None:
    gateway = FakeGateway(slots=3)
    service = make_service(tmp_path, gateway)
    lines = [line(f"id-{n}", "fail" if n == 4 else f"ok-{n}") for n in range(20)]
    status, file = upload(service, jsonl(lines))
    assert (status, file["purpose"], file["object"]) == (200, "batch", "file")
    batch = run(service, create_body(file["id"]))
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 20, "completed": 19, "failed": 1}
    assert batch["metadata"] == {"job": "eval"}
    assert batch["usage"]["input_tokens"] == 19 * 3
    output = content(service, batch["output_file_id"])
    assert [entry["custom_id"] for entry in output] == [f"id-{n}" for n in range(20) if n != 4]
    assert output[0]["response"]["status_code"] == 200
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "ok-0"
    [error] = content(service, batch["error_file_id"])
    assert (error["custom_id"], error["response"]["status_code"]) == ("id-4", 400)
    assert sorted(gateway.sent) == sorted([f"ok-{n}" for n in range(20) if n != 4] + ["fail"])
    assert gateway.most_in_flight == 3  # the backends' background slots, no more


def test_a_refusal_for_load_is_tried_again_not_failed(tmp_path: Path) -> None:
    gateway = FakeGateway()
    gateway.unreachable = 2  # the app restarting under the first tries
    service = make_service(tmp_path, gateway)
    _, file = upload(service, jsonl([line("a", "busy-a"), line("b")]))
    batch = run(service, create_body(file["id"]))
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert batch["error_file_id"] is None


def test_a_batch_cut_off_mid_chunk_resumes_from_its_last_commit_with_nothing_twice(
    tmp_path: Path,
) -> None:
    gateway = FakeGateway(slots=2)  # chunks of 4 lines
    service = make_service(tmp_path, gateway)
    _, file = upload(service, jsonl([line(f"id-{n}") for n in range(10)]))

    gateway.hold_after = 9  # two chunks committed, one line of the third answered

    async def crash_in_third_chunk() -> str:
        _, batch = service.create(OWNER, create_body(file["id"]))
        await gateway.until_sent(9)
        await asyncio.sleep(0.05)
        await service.stop()  # the process dies: nothing more is committed
        return str(batch["id"])

    batch_id = asyncio.run(crash_in_third_chunk())
    assert service.batch(OWNER, batch_id)[1]["request_counts"]["completed"] == 8
    sent_before = list(gateway.sent)
    gateway.hold_after = None
    restarted = make_service(tmp_path, gateway)  # a new process over the same directory

    async def resume() -> dict[str, Any]:
        assert restarted.resume() == [batch_id]
        await restarted.wait(batch_id)
        return restarted.batch(OWNER, batch_id)[1]

    batch = asyncio.run(resume())
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
    output = content(restarted, batch["output_file_id"])
    assert [entry["custom_id"] for entry in output] == [f"id-{n}" for n in range(10)]
    # Committed lines never ran again; only the uncommitted chunk's lines might.
    again = gateway.sent[len(sent_before) :]
    assert set(again) <= {f"id-{n}" for n in range(8, 10)}


def test_a_cancelled_batch_keeps_what_ran_and_runs_nothing_more(tmp_path: Path) -> None:
    gateway = FakeGateway(slots=1)
    service = make_service(tmp_path, gateway)
    _, file = upload(service, jsonl([line(f"id-{n}") for n in range(30)]))

    async def cancel_midway() -> dict[str, Any]:
        _, batch = service.create(OWNER, create_body(file["id"]))
        await gateway.until_sent(5)
        status, cancelling = service.cancel(OWNER, batch["id"])
        assert (status, cancelling["status"]) == (200, "cancelling")
        await service.wait(batch["id"])
        return service.batch(OWNER, batch["id"])[1]

    batch = asyncio.run(cancel_midway())
    assert batch["status"] == "cancelled"
    assert batch["cancelled_at"] is not None
    done = batch["request_counts"]["completed"]
    assert 5 <= done < 30
    assert len(content(service, batch["output_file_id"])) == done
    assert len(gateway.sent) == done  # nothing ran that was not kept
    assert service.cancel(OWNER, batch["id"])[0] == 409


def test_past_its_window_a_batch_expires_and_its_unrun_lines_are_errors(tmp_path: Path) -> None:
    now = [1000.0]
    gateway = FakeGateway(slots=1)
    service = make_service(tmp_path, gateway, clock=lambda: now[0])
    _, file = upload(service, jsonl([line(f"id-{n}") for n in range(6)]))

    async def expire() -> dict[str, Any]:
        _, batch = service.create(OWNER, create_body(file["id"]))
        await gateway.until_sent(2)
        now[0] += 24 * 3600
        await service.wait(batch["id"])
        return service.batch(OWNER, batch["id"])[1]

    batch = asyncio.run(expire())
    assert batch["status"] == "expired"
    output = content(service, batch["output_file_id"])
    errors = content(service, batch["error_file_id"])
    assert len(output) + len(errors) == 6
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"endpoint": "/v1/images"}, "endpoint"),
        ({"endpoint": "/v1/embeddings"}, "endpoint"),  # the lines name chat
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
    ],
)
def test_a_batch_that_cannot_run_is_refused_at_create(
    tmp_path: Path, change: dict[str, Any], param: str
) -> None:
    service = make_service(tmp_path, FakeGateway())
    _, file = upload(service, jsonl([line("a")]))
    status, body = service.create(OWNER, {**create_body(file["id"]), **change})
    assert status in (400, 404)
    assert body["error"]["param"] == param
    assert service.batches(OWNER)[1]["data"] == []


def test_files_and_batches_are_their_owners_alone(tmp_path: Path) -> None:
    service = make_service(tmp_path, FakeGateway())
    _, file = upload(service, jsonl([line("a")]))
    assert service.file("mallory", file["id"])[0] == 404
    assert service.create("mallory", create_body(file["id"]))[0] == 404
    assert service.delete_file(OWNER, file["id"])[0] == 200
    assert service.file(OWNER, file["id"])[0] == 404


def test_the_store_keeps_sqlite_in_wal_mode_or_the_rollback_journal_on_shared_storage(
    tmp_path: Path,
) -> None:
    assert BatchStore(tmp_path / "local").journal_mode == "wal"
    assert BatchStore(tmp_path / "shared", shared_storage=True).journal_mode == "delete"


def test_a_chunk_commits_whole_or_not_at_all(tmp_path: Path) -> None:
    service = make_service(tmp_path, FakeGateway())
    _, file = upload(service, jsonl([line("a"), line("b")]))
    store = BatchStore(tmp_path)

    async def created() -> str:
        _, batch = service.create(OWNER, create_body(file["id"]))
        await service.stop()  # not run: the test commits by hand
        return str(batch["id"])

    batch_id = asyncio.run(created())
    good = ChunkResult(1, True, '{"ok": 1}')
    with pytest.raises(sqlite3.ProgrammingError):  # the second row fails: the first goes too
        store.commit_chunk(batch_id, [good, ChunkResult(2, True, object())], 3)  # type: ignore[arg-type]
    row = store.batch(batch_id)
    assert row is not None
    assert (row.counts.completed, row.next_line) == (0, 1)
    assert not store.has_result(batch_id, 1)


class BrokenGateway(FakeGateway):
    """The gateway's port itself breaks on one line (a bug, not an answer)."""

    async def answer(self, endpoint: str, body: dict[str, Any], owner: str) -> Answer:
        if body["messages"][0]["content"] == "break":
            await asyncio.sleep(0.01)
            raise RuntimeError("a bug in the port")
        return await super().answer(endpoint, body, owner)


def test_a_run_that_breaks_fails_the_batch_keeping_what_it_committed(tmp_path: Path) -> None:
    gateway = BrokenGateway(slots=1)  # chunks of 2 lines
    service = make_service(tmp_path, gateway)
    lines = [line("a"), line("b"), line("c"), line("d", "break"), line("e"), line("f")]
    _, file = upload(service, jsonl(lines))
    batch = run(service, create_body(file["id"]))
    assert batch["status"] == "failed"
    assert batch["errors"]["data"][0]["code"] == "batch_failed"
    assert [e["custom_id"] for e in content(service, batch["output_file_id"])] == ["a", "b", "c"]
    assert gateway.sent == ["a", "b", "c"]  # nothing was sent after the break
    assert batch["request_counts"]["completed"] == 3


def test_the_input_of_a_batch_that_has_not_ended_cannot_be_deleted(tmp_path: Path) -> None:
    gateway = FakeGateway()
    gateway.hold_after = 0  # every answer hangs: the batch stays in progress
    service = make_service(tmp_path, gateway)
    _, file = upload(service, jsonl([line("a")]))

    async def delete_while_running() -> int:
        service.create(OWNER, create_body(file["id"]))
        await asyncio.sleep(0.01)
        status = service.delete_file(OWNER, file["id"])[0]
        await service.stop()
        return status

    assert asyncio.run(delete_while_running()) == 409
    assert service.file(OWNER, file["id"])[0] == 200


def test_a_line_fails_after_three_server_errors_however_many_refusals_for_load(
    tmp_path: Path,
) -> None:
    class Flaky(FakeGateway):
        def __init__(self) -> None:
            super().__init__()
            self.answers = [429, 429, 500, 503, 500, 500]

        async def answer(self, endpoint: str, body: dict[str, Any], owner: str) -> Answer:
            self.calls += 1
            status = self.answers.pop(0)
            return Answer(status, {"error": {"message": str(status)}}, retry_after_s=0.001)

    gateway = Flaky()
    service = make_service(tmp_path, gateway)
    _, file = upload(service, jsonl([line("a")]))
    batch = run(service, create_body(file["id"]))
    assert batch["request_counts"]["failed"] == 1
    assert gateway.answers == []  # all six tries: the two 429s and the 503 did not count
    [error] = content(service, batch["error_file_id"])
    assert error["response"]["status_code"] == 500
