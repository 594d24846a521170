"""OpenAI's Files and Batch API routes (/v1/files, /v1/batches) on the ingress's FastAPI app.

The routes are `FilesRoutes`' methods, which the Ingress class inherits: Serve calls them on the
replica's own ingress (its class-based view), whose `_batches` (deployments/ingress/batch_api.py)
answers them; batch lines come back to the ingress's own `batch_answer` through Serve's handle,
at background priority.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.ingress.batch_api import BatchApi

__all__ = ["FilesRoutes", "files_routes"]

files_routes = APIRouter()


class FilesRoutes:
    """The Files and Batch routes, as methods the Ingress inherits (its `_batches` answers them)."""

    _batches: BatchApi

    @files_routes.post("/v1/files")
    async def upload_file(self, request: Request) -> Response:
        return await self._batches.upload(request)

    @files_routes.get("/v1/files")
    async def list_files(self, request: Request) -> Response:
        return await self._batches.files(request)

    @files_routes.get("/v1/files/{file_id}")
    async def get_file(self, request: Request, file_id: str) -> Response:
        return await self._batches.file(request, file_id)

    @files_routes.delete("/v1/files/{file_id}")
    async def delete_file(self, request: Request, file_id: str) -> Response:
        return await self._batches.delete_file(request, file_id)

    @files_routes.get("/v1/files/{file_id}/content")
    async def file_content(self, request: Request, file_id: str) -> Response:
        return await self._batches.content(request, file_id)

    @files_routes.post("/v1/batches")
    async def create_batch(self, request: Request) -> Response:
        return await self._batches.create(request)

    @files_routes.get("/v1/batches")
    async def list_batches(self, request: Request) -> Response:
        return await self._batches.batches(request)

    @files_routes.get("/v1/batches/{batch_id}")
    async def get_batch(self, request: Request, batch_id: str) -> Response:
        return await self._batches.batch(request, batch_id)

    @files_routes.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(self, request: Request, batch_id: str) -> Response:
        return await self._batches.cancel(request, batch_id)
