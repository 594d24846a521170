"""The OpenAI Batch API through the official SDK against the session's real app: upload,
create, poll, download; a bad body fails its own line only; cancel; the batch service killed
with SIGKILL mid-batch goes on from its last committed chunk with every line once."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from typing import Any

import httpx
import openai
import pytest
import ray
from ray.serve.handle import DeploymentHandle

from deployments.batch.actor import batch_actor_name
from tests.e2e.test_images import RED

POLL_S = 0.5
CHUNK = 16  # batches.chunk_rounds (16) x coding@local's background slots (a cap of 2, half)


def request_line(custom_id: str, content: Any, max_tokens: Any = 4) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "coding",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
    }


def upload(client: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_until(client: openai.OpenAI, batch_id: str, done: set[str], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        # A 503 while the service restarts: the SDK tries again after its Retry-After.
        batch = client.with_options(max_retries=10).batches.retrieve(batch_id)
        if batch.status in done:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(POLL_S)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(text) for text in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_to_completed_and_a_bad_body_fails_only_its_own_line(
    client: openai.OpenAI,
) -> None:
    lines = [request_line(f"q-{n}", f"Say the number {n}.") for n in range(12)]
    lines[5] = request_line("q-5", "This one is bad.", max_tokens=-3)
    # An image, as a request carries it: read by the vision model; and one by URL, which this
    # gateway fetches from no host (gateway.media.allowed_domains): that line fails alone.
    lines[6] = request_line("q-6", [{"type": "image_url", "image_url": {"url": RED}},
                                    {"type": "text", "text": "What is this?"}])  # fmt: skip
    lines[7] = request_line(
        "q-7", [{"type": "image_url", "image_url": {"url": "http://10.0.0.1/a.png"}}]
    )
    file_id = upload(client, lines)
    assert client.files.retrieve(file_id).purpose == "batch"
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"suite": "e2e"},
    )
    assert batch.status in ("validating", "in_progress")
    batch = wait_until(client, batch.id, {"completed", "failed"}, 600)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (12, 10)
    assert batch.request_counts.failed == 2
    output = lines_of(client, batch.output_file_id)
    assert sorted(entry["custom_id"] for entry in output) == sorted(
        f"q-{n}" for n in range(12) if n not in (5, 7)
    )
    for entry in output:
        assert entry["response"]["status_code"] == 200
        assert entry["response"]["body"]["choices"][0]["message"]["content"]
    [image] = [entry for entry in output if entry["custom_id"] == "q-6"]
    assert image["response"]["body"]["usage"]["prompt_tokens"] > 5 * 64  # its tiles were read
    errors = {
        entry["custom_id"]: entry["response"] for entry in lines_of(client, batch.error_file_id)
    }
    assert sorted(errors) == ["q-5", "q-7"]
    assert errors["q-5"]["status_code"] == errors["q-7"]["status_code"] == 400
    assert errors["q-5"]["body"]["error"]["param"] == "max_tokens"
    assert errors["q-7"]["body"]["error"]["param"] == "messages[0].content[0].image_url.url"
    assert batch.id in [b.id for b in client.batches.list()]


def test_a_file_with_a_broken_line_is_refused_with_its_line_number(client: openai.OpenAI) -> None:
    data = json.dumps(request_line("a", "hi")).encode() + b"\n{broken\n"
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="batch")
    assert "line 2" in str(refused.value)


def test_a_cancelled_batch_ends_cancelled_with_what_it_ran(client: openai.OpenAI) -> None:
    file_id = upload(client, [request_line(f"c-{n}", f"Count to {n}.", 16) for n in range(200)])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(client, batch.id, {"in_progress"}, 60)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = wait_until(client, batch.id, {"cancelled"}, 300)
    assert batch.request_counts is not None
    done = batch.request_counts.completed
    assert done < 200
    assert len(lines_of(client, batch.output_file_id)) == done


def test_the_batch_service_killed_mid_batch_finishes_with_every_line_once(
    client: openai.OpenAI, probe: DeploymentHandle
) -> None:
    count = 40
    probe.reset_counts.remote().result()  # counts the calls reaching coding@local
    file_id = upload(client, [request_line(f"k-{n}", f"Name a colour, {n}.") for n in range(count)])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 300
    while client.batches.retrieve(batch.id).request_counts.completed < 4:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    service = ray.get_actor(batch_actor_name("gateway"), namespace="serve")
    pid = ray.get(service.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGKILL)  # mid-chunk: what the chunk answered is not committed
    batch = wait_until(client, batch.id, {"completed", "failed"}, 600)
    assert batch.status == "completed", batch
    output = lines_of(client, batch.output_file_id)
    ids = [entry["custom_id"] for entry in output]
    assert sorted(ids) == sorted(f"k-{n}" for n in range(count))  # each once
    restarted = ray.get(service.__ray_call__.remote(lambda self: os.getpid()))
    assert restarted != pid
    # Only the chunk that was running when the service died ran again: coding@local's cap of
    # two, half of it for background work, sixteen rounds of that a chunk.
    calls = probe.counts.remote().result()["calls"]
    assert count <= calls <= count + CHUNK


def test_batch_calls_need_a_key_and_see_only_their_own_objects(gateway: str) -> None:
    assert httpx.get(f"{gateway}/v1/batches", timeout=30).status_code == 401
    missing = httpx.get(
        f"{gateway}/v1/files/file-nope",
        headers={"Authorization": "Bearer test-user-key"},
        timeout=30,
    )
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
