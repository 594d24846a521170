"""A batch of chat lines through the official `openai` SDK, and its end checked: the suites
that cut a running batch off (tests/batch: the whole cluster; tests/gcs: the GCS, the head)."""

from __future__ import annotations

import io
import json

import openai

from tests.waiting import wait_for

BATCH_END_TIMEOUT_S = 900.0


def submit(client: openai.OpenAI, lines: int, model: str = "coding") -> str:
    """A batch of `lines` short chats (custom ids line-0, line-1, ...); its id."""
    entries = [
        {"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "max_tokens": 6,
                  "messages": [{"role": "user", "content": f"Say {n} twice."}]}}
        for n in range(lines)
    ]  # fmt: skip
    data = "".join(json.dumps(entry) + "\n" for entry in entries).encode()
    file = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return counts.completed if counts else 0


def assert_every_line_once(client: openai.OpenAI, batch_id: str, lines: int) -> None:
    """The batch ends completed, with every line answered once, in input order."""
    wait_for(
        lambda: client.batches.retrieve(batch_id).status in ("completed", "failed"),
        BATCH_END_TIMEOUT_S,
        "the batch to end",
    )
    ended = client.batches.retrieve(batch_id)
    assert ended.status == "completed", ended
    assert ended.request_counts is not None
    assert (ended.request_counts.completed, ended.request_counts.failed) == (lines, 0)
    assert ended.output_file_id is not None
    text = client.files.content(ended.output_file_id).text
    output = [json.loads(line) for line in text.splitlines()]
    assert [entry["custom_id"] for entry in output] == [f"line-{n}" for n in range(lines)]
    assert all(entry["response"]["status_code"] == 200 for entry in output)
