"""A batch survives the whole cluster going down: the Ray cluster, the Serve app, the batch
service and the engines stopped mid-batch, a new cluster started and the app run again the way
`serve run` runs it; the batch goes on from its last committed chunk and completes with every
`custom_id` exactly once in its output, through the official `openai` SDK. A response stored
before the restart (the Responses API's state, kept by the gateway) is read and continued after
it."""

from __future__ import annotations

from pathlib import Path

import openai
import ray
from ray import serve

from cluster.app import build_app
from cluster.ray_runtime import local_pool_resources
from core.config import ClusterConfig, load_config
from tests.batches import assert_every_line_once, completed, submit
from tests.local_ray import start_retrying, stop_serve_and_ray
from tests.waiting import wait_for

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


def test_a_batch_cut_off_by_a_cluster_restart_completes_with_every_line_once(
    tmp_path: Path,
) -> None:
    stored = str(tmp_path / "responses.sqlite3")
    overrides = {"batches": {"directory": str(tmp_path)}, "gateway": {"responses_db": stored}}
    config = load_config(CONFIG, environ={}, overrides=overrides)
    client = start(config)
    try:
        batch = submit(client, LINES)
        kept = client.responses.create(model="coding", input="Remember: blue.", max_output_tokens=2)
        wait_for(lambda: completed(client, batch) >= 10, 600, "ten lines committed")
        before = completed(client, batch)
        assert before < LINES, "the batch ended before the restart: nothing left to resume"
    finally:
        stop()  # mid-batch: every process of the cluster goes, the batch service with it
    client = start(config)
    try:
        assert_every_line_once(client, batch, LINES)
        print(f"\nbatch across a cluster restart: {before} of {LINES} lines committed before it")
        assert client.responses.retrieve(kept.id).output_text == kept.output_text
        follow = client.responses.create(
            model="coding", input="Which colour?", previous_response_id=kept.id, max_output_tokens=2
        )
        items = client.responses.input_items.list(follow.id, order="asc").data
        texts = [part.text for item in items for part in getattr(item, "content", [])]
        assert texts == ["Remember: blue.", kept.output_text, "Which colour?"]
    finally:
        stop()
