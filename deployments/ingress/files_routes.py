"""OpenAI's Files and Batch API routes (/v1/files, /v1/batches) on the ingress's FastAPI app.

Each hands its request to the replica's `BatchApi` (deployments/ingress/batch_api.py), which the
ingress registers here (`use_batch_api`); batch lines come back to the ingress's own
`batch_answer` through Serve's handle, at background priority.

The API is held in this module, not in `app.state`: Serve runs a replica's copy of the FastAPI
app (unpickled from the `serve.ingress` class), so the module-level `app` the ingress sees in
its `__init__` is not the `request.app` a route gets. The module is imported by reference in
the replica's process, one ingress per process, so both see this one holder.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.ingress.batch_api import BatchApi

__all__ = ["files_routes", "use_batch_api"]

files_routes = APIRouter()


_held: list[BatchApi] = []


def use_batch_api(api: BatchApi) -> None:
    """Serve the Files and Batch routes of this process's ingress with `api`."""
    _held[:] = [api]


def _api(request: Request) -> BatchApi:
    del request  # the routes' signature; the API is the process's own (see the docstring)
    return _held[0]


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
