"""OpenAI's Files and Batch API routes (/v1/files, /v1/batches) on the ingress's FastAPI app.

Each hands its request to the replica's `BatchApi` (deployments/batch/http.py), which the
ingress keeps in the app's state (`use_batch_api`); batch lines come back to the ingress's own
`batch_answer` through Serve's handle, at background priority.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from deployments.batch.http import BatchApi

__all__ = ["files_routes", "use_batch_api"]

files_routes = APIRouter()


def use_batch_api(app: FastAPI, api: BatchApi) -> None:
    """Serve the Files and Batch routes of `app` with `api`."""
    app.state.batch_api = api


def _api(request: Request) -> BatchApi:
    api: BatchApi = request.app.state.batch_api
    return api


@files_routes.post("/v1/files")
async def upload_file(request: Request) -> Response:
    return await _api(request).upload(request)


@files_routes.get("/v1/files")
async def list_files(request: Request) -> Response:
    return await _api(request).files(request)


@files_routes.get("/v1/files/{file_id}")
async def get_file(request: Request, file_id: str) -> Response:
    return await _api(request).file(request, file_id)


@files_routes.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> Response:
    return await _api(request).delete_file(request, file_id)


@files_routes.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> Response:
    return await _api(request).content(request, file_id)


@files_routes.post("/v1/batches")
async def create_batch(request: Request) -> Response:
    return await _api(request).create(request)


@files_routes.get("/v1/batches")
async def list_batches(request: Request) -> Response:
    return await _api(request).batches(request)


@files_routes.get("/v1/batches/{batch_id}")
async def get_batch(request: Request, batch_id: str) -> Response:
    return await _api(request).batch(request, batch_id)


@files_routes.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> Response:
    return await _api(request).cancel(request, batch_id)
