"""The Batch API's HTTP side on the ingress: `/v1/files` and `/v1/batches` as OpenAI has
them, each call authenticated and passed to the app's batch service (one actor: every ingress
replica sees the same files and batches). Uploads and downloads stream part by part."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray.exceptions import ActorDiedError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from core.config import BatchConfig
from core.errors import ApiError, ErrorCode
from deployments.ingress.auth import KeyRing
from deployments.ingress.body import DIGITS, read_body
from policy.request import parse_object

logger = logging.getLogger("ray.serve")

__all__ = ["BatchApi"]

PART_BYTES = 1024 * 1024
CREATE_BYTES = 64 * 1024  # a create's body: ids, an endpoint, a window and 16 metadata pairs
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the purpose field, past the file's size


class BatchApi:
    def __init__(
        self,
        keys: KeyRing,
        service: Callable[[], Any],
        settings: BatchConfig,
        max_json_depth: int,
    ) -> None:
        self._keys = keys
        self._service = service  # the actor, looked up when first needed
        self._settings = settings
        self._max_depth = max_json_depth

    def start(self) -> None:
        """Start the service (in the background: it takes up unfinished batches itself)."""
        try:
            self._service()
        except Exception as error:  # noqa: BLE001 - the first call starts it again
            logger.warning("batch service: not started yet: %r", error)

    async def upload(self, request: Request) -> Response:
        owner = self._owner(request)
        declared = request.headers.get("content-length", "")
        limit = self._settings.max_file_bytes
        if not DIGITS.fullmatch(declared):  # a form is spooled whole before it is read
            raise ApiError(411, ErrorCode.INVALID_REQUEST,
                           "Send the upload with a Content-Length (not chunked).")  # fmt: skip
        if int(declared) > limit + FORM_OVERHEAD:
            raise _too_large(limit)
        if "multipart/form-data" not in request.headers.get("content-type", ""):
            raise ApiError(400, ErrorCode.INVALID_REQUEST,
                           "Send the file as multipart/form-data with fields 'file' and "
                           "'purpose'.")  # fmt: skip
        try:
            form = await request.form(max_files=1, max_fields=8)
        except Exception as error:  # noqa: BLE001 - any malformed multipart body is the client's
            raise ApiError(400, ErrorCode.INVALID_REQUEST, f"Unreadable form: {error}") from None
        try:
            file, purpose = form.get("file"), form.get("purpose")
            if not isinstance(file, UploadFile):
                raise ApiError(400, ErrorCode.INVALID_REQUEST, "The field 'file' is required.",
                               param="file")  # fmt: skip
            if not isinstance(purpose, str):
                raise ApiError(400, ErrorCode.INVALID_REQUEST,
                               "The field 'purpose' is required.", param="purpose")  # fmt: skip
            return _json(await self._upload(owner, file, purpose))
        finally:
            await form.close()

    async def _upload(self, owner: str, file: UploadFile, purpose: str) -> tuple[int, Any]:
        upload_id = await self._call("upload_begin", owner, file.filename or "", purpose)
        try:
            while part := await file.read(PART_BYTES):
                if not await self._call("upload_part", upload_id, part):
                    break  # refused (too large, wrong purpose): the end says why
            return await self._call("upload_end", upload_id)  # type: ignore[no-any-return]
        except BaseException:
            await self._call("upload_abort", upload_id)
            raise

    async def file(self, request: Request, file_id: str) -> Response:
        return _json(await self._call("file", self._owner(request), file_id))

    async def files(self, request: Request) -> Response:
        purpose = request.query_params.get("purpose")
        return _json(await self._call("files", self._owner(request), purpose))

    async def delete_file(self, request: Request, file_id: str) -> Response:
        return _json(await self._call("delete_file", self._owner(request), file_id))

    async def content(self, request: Request, file_id: str) -> Response:
        owner = self._owner(request)
        status, first = await self._call("content_part", owner, file_id, 0)
        if status != 200:
            return _json((status, first))

        async def parts() -> AsyncIterator[bytes]:
            part, offset = first, 0
            while part:
                yield part
                offset += len(part)
                _, part = await self._call("content_part", owner, file_id, offset)

        return StreamingResponse(parts(), media_type="application/jsonl")

    async def create(self, request: Request) -> Response:
        owner = self._owner(request)
        body = parse_object(await read_body(request, CREATE_BYTES), self._max_depth)
        return _json(await self._call("create", owner, body))

    async def batch(self, request: Request, batch_id: str) -> Response:
        return _json(await self._call("batch", self._owner(request), batch_id))

    async def batches(self, request: Request) -> Response:
        params = request.query_params
        limit = params.get("limit", "20")
        if not DIGITS.fullmatch(limit):
            raise ApiError(400, ErrorCode.INVALID_REQUEST, "limit must be a whole number",
                           param="limit")  # fmt: skip
        reply = await self._call("batches", self._owner(request), params.get("after"), int(limit))
        return _json(reply)

    async def cancel(self, request: Request, batch_id: str) -> Response:
        return _json(await self._call("cancel", self._owner(request), batch_id))

    def _owner(self, request: Request) -> str:
        return self._keys.authenticate(request.headers.get("authorization")).name

    async def _call(self, name: str, *args: Any) -> Any:
        try:
            # The first look may start the service: Ray's calls block, the event loop must not.
            service = await asyncio.to_thread(self._service)
            return await service.call.remote(name, *args)
        except Exception as error:  # noqa: BLE001 - the service restarting: the client retries
            logger.warning("batch service call %s failed: %r", name, error)
            forget = getattr(self._service, "cache_clear", None)
            if isinstance(error, ActorDiedError) and forget is not None:
                forget()  # gone for good (replaced for another config): look it up again
            raise ApiError(503, ErrorCode.BACKEND_UNAVAILABLE,
                           "The batch service is restarting; try again shortly.",
                           headers={"Retry-After": "5"}) from None  # fmt: skip


def _json(reply: tuple[int, Any]) -> Response:
    status, body = reply
    return JSONResponse(body, status_code=status)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, ErrorCode.REQUEST_TOO_LARGE, f"The file exceeds {limit} bytes.")
