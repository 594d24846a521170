"""The Batch API's HTTP side driven by the official `openai` SDK (its async client over an ASGI
transport: no network, no Ray), in front of the real service and store with a gateway the test
holds: what the SDK sends (multipart uploads, cursor pages) is what the ingress parses."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import openai
import pytest
from fastapi import FastAPI
from ray import cloudpickle, serve
from ray.serve._private.http_util import make_fastapi_class_based_view
from ray.serve._private.utils import ensure_serialization_context

from core.config import BatchConfig
from core.errors import ApiError
from core.types import PriorityClass
from deployments.batch.service import BatchService
from deployments.batch.store import BatchStore
from deployments.ingress.auth import KeyRing
from deployments.ingress.batch_api import BatchApi
from deployments.ingress.error_response import error_response
from deployments.ingress.files_routes import FilesRoutes, files_routes
from tests.unit.test_batch_service import FakeGateway, jsonl, line


class LocalActor:
    """The service as the ingress reaches it (`call.remote(name, *args)`), in this process."""

    def __init__(self, service: BatchService) -> None:
        self.service = service
        self.call = self

    async def remote(self, name: str, *args: Any) -> Any:
        return getattr(self.service, name)(*args)


def batch_app(api: BatchApi, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    """The ingress's own Files and Batch routes, on an app of their own, served as Serve serves
    an ingress's app: a cloudpickled copy of it, its routes the methods of the replica's own
    instance (Serve's class-based view; the replica's context is the one thing stood in)."""

    class Front(FilesRoutes):
        def __init__(self) -> None:
            self._batches = api

    app = FastAPI()
    app.exception_handler(ApiError)(lambda _, error: error_response(error))
    app.include_router(files_routes)
    ensure_serialization_context()  # Serve's own reducers (serve.ingress does the same)
    served: FastAPI = cloudpickle.loads(cloudpickle.dumps(app))
    make_fastapi_class_based_view(served, Front)
    front = Front()
    monkeypatch.setattr(
        serve, "get_replica_context", lambda: SimpleNamespace(servable_object=front)
    )
    return served


def test_the_sdk_uploads_runs_pages_and_downloads_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = BatchConfig(retry_pause_s=0.01, max_file_bytes=4096)
    service = BatchService(BatchStore(tmp_path), FakeGateway(), settings, max_json_depth=64)
    api = BatchApi(KeyRing((), PriorityClass.USER), lambda: LocalActor(service), settings, 64)
    transport = httpx2.ASGITransport(app=batch_app(api, monkeypatch))  # the SDK's own httpx

    async def scenario() -> None:
        client = openai.AsyncOpenAI(
            base_url="http://gateway/v1",
            api_key="none",
            http_client=httpx2.AsyncClient(transport=transport, base_url="http://gateway"),
        )
        data = jsonl([line(f"id-{n}") for n in range(5)])
        file = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        assert (file.bytes, file.purpose, file.filename) == (len(data), "batch", "in.jsonl")
        batches = [
            await client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            for _ in range(3)
        ]
        for batch in batches:
            await service.wait(batch.id)
        done = await client.batches.retrieve(batches[0].id)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert done.request_counts.completed == 5
        assert done.output_file_id is not None
        text = (await client.files.content(done.output_file_id)).text
        assert [json.loads(t)["custom_id"] for t in text.splitlines()] == [
            f"id-{n}" for n in range(5)
        ]
        page = await client.batches.list(limit=2)  # newest first, then the next page
        seen = [b.id async for b in page]
        assert seen == [b.id for b in reversed(batches)]
        with pytest.raises(openai.BadRequestError, match="purpose"):
            await client.files.create(file=("x.jsonl", io.BytesIO(data)), purpose="user_data")
        too_big = jsonl([line(f"big-{n}", "x" * 300) for n in range(20)])
        with pytest.raises(openai.APIStatusError) as refused:
            await client.files.create(file=("big.jsonl", io.BytesIO(too_big)), purpose="batch")
        assert refused.value.status_code == 413
        await client.close()

    asyncio.run(scenario())
