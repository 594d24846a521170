"""A batch survives the whole cluster going down: the Ray cluster, the Serve app, the batch
service and the engines stopped mid-batch, a new cluster started and the app run again the way
`serve run` runs it; the batch goes on from its last committed chunk and completes with every
`custom_id` exactly once in its output, through the official `openai` SDK."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import openai
import ray
from ray import serve

from cluster.app import build_app
from cluster.ray_runtime import local_pool_resources
from core.config import ClusterConfig, load_config
from tests.local_ray import start_retrying, stop_serve_and_ray

CONFIG = Path(__file__).with_name("batch.yaml")
PORT = 18950
LINES = 60


def start(config: ClusterConfig) -> openai.OpenAI:
    start_retrying(
        lambda: ray.init(
            address="local", namespace="serve", num_cpus=3, resources=local_pool_resources(config)
        )
    )
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(config), name="batches", route_prefix="/")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="none",
                         max_retries=5, timeout=120)  # fmt: skip


def stop() -> None:
    stop_serve_and_ray()


def completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return counts.completed if counts else 0


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_batch_cut_off_by_a_cluster_restart_completes_with_every_line_once(
    tmp_path: Path,
) -> None:
    config = load_config(CONFIG, environ={})
    config = config.model_copy(
        update={"batches": config.batches.model_copy(update={"directory": tmp_path})}
    )
    lines = [
        {"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "coding", "max_tokens": 6,
                  "messages": [{"role": "user", "content": f"Say {n} twice."}]}}
        for n in range(LINES)
    ]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    client = start(config)
    try:
        file = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_for(lambda: completed(client, batch.id) >= 10, 600, "ten lines committed")
        before = completed(client, batch.id)
        assert before < LINES, "the batch ended before the restart: nothing left to resume"
    finally:
        stop()  # mid-batch: every process of the cluster goes, the batch service with it
    client = start(config)
    try:
        wait_for(
            lambda: client.batches.retrieve(batch.id).status in ("completed", "failed"),
            900,
            "the batch to end after the restart",
        )
        ended = client.batches.retrieve(batch.id)
        assert ended.status == "completed", ended
        assert ended.request_counts is not None
        assert (ended.request_counts.completed, ended.request_counts.failed) == (LINES, 0)
        assert ended.output_file_id is not None
        output = [
            json.loads(t) for t in client.files.content(ended.output_file_id).text.splitlines()
        ]
        ids = [entry["custom_id"] for entry in output]
        assert ids == [f"line-{n}" for n in range(LINES)]  # each once, in input order
        assert all(entry["response"]["status_code"] == 200 for entry in output)
        print(f"\nbatch across a cluster restart: {before} of {LINES} lines committed before it")
    finally:
        stop()
