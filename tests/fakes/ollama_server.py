"""A small Ollama stand-in that follows Ollama's documented API (docs/api.md), for tests.

`python ollama_server.py serve` listens on OLLAMA_HOST, as `ollama serve` does. It implements
what the fallback uses: `/`, `/api/version`, `/api/blobs/:digest` (HEAD, POST), `/api/create`
(`files`, `parameters`), `/api/show`, `/api/tags`, `/api/pull` and `/api/chat` (NDJSON stream,
`options.num_ctx`, `options.num_predict`, `keep_alive`, `done_reason`, token counts). Its "model"
answers by echoing the latest user message word by word. Two test-only routes under `/_fake`
show what it was asked and switch on a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

blobs: dict[str, int] = {}  # digest -> size
models: dict[str, dict[str, Any]] = {}
asked: dict[str, list[dict[str, Any]]] = {"create": [], "chat": [], "pull": [], "blob_uploads": []}
failure: dict[str, str | None] = {"mode": None}


def full_name(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def root(_: Request) -> Response:
    return PlainTextResponse("Ollama is running")


async def version(_: Request) -> Response:
    return JSONResponse({"version": "0.0.0-fake"})


async def blob(request: Request) -> Response:
    digest = request.path_params["digest"]
    if request.method == "HEAD":
        return Response(status_code=200 if digest in blobs else 404)
    body = await request.body()
    if f"sha256:{hashlib.sha256(body).hexdigest()}" != digest:
        return error(400, "digest mismatch")
    blobs[digest] = len(body)
    asked["blob_uploads"].append({"digest": digest, "size": len(body)})
    return Response(status_code=201)


async def create(request: Request) -> Response:
    body = await request.json()
    asked["create"].append(body)
    files = body.get("files") or {}
    missing = [d for d in files.values() if d not in blobs]
    if not files or missing:
        return error(400, f"neither 'from' or 'files' was specified or blobs missing: {missing}")
    models[full_name(body["model"])] = {
        "files": files,
        "parameters": body.get("parameters") or {},
    }
    return JSONResponse({"status": "success"})


async def show(request: Request) -> Response:
    name = full_name((await request.json()).get("model", ""))
    if name not in models:
        return error(404, f"model '{name}' not found")
    parameters = models[name]["parameters"]
    text = "\n".join(f"{k} {v}" for k, v in parameters.items())
    return JSONResponse({"parameters": text, "details": {"format": "gguf"}, "model_info": {}})


async def tags(_: Request) -> Response:
    return JSONResponse({"models": [{"name": n, "model": n} for n in models]})


async def pull(request: Request) -> Response:
    body = await request.json()
    asked["pull"].append(body)
    models[full_name(body["model"])] = {"files": {}, "parameters": {}}
    return JSONResponse({"status": "success"})


async def chat(request: Request) -> Response:
    body = await request.json()
    asked["chat"].append(body)
    name = full_name(body.get("model", ""))
    if name not in models:
        return error(404, f'model "{body.get("model")}" not found, try pulling it first')
    options = body.get("options") or {}
    num_ctx = int(options.get("num_ctx", models[name]["parameters"].get("num_ctx", 2048)))
    limit = int(options.get("num_predict", -1))
    messages = body.get("messages") or []
    prompt_tokens = sum(len(str(m.get("content", "")).split()) + 4 for m in messages)
    users = [m for m in messages if m.get("role") == "user"]
    words = ["Echo:", *(str(users[-1]["content"]).split() if users else [])]
    room = max(0, num_ctx - prompt_tokens)
    budget = min(limit if limit >= 0 else room, room)
    said = words[:budget]
    reason = "length" if len(said) < len(words) else "stop"

    async def lines() -> AsyncIterator[str]:
        for i, word in enumerate(said):
            if failure["mode"] == "error_line" and i == 1:
                yield json.dumps({"error": "an injected failure"}) + "\n"
                return
            piece = word if i == 0 else f" {word}"
            yield (
                json.dumps(
                    {
                        "model": name,
                        "message": {"role": "assistant", "content": piece},
                        "done": False,
                    }
                )
                + "\n"
            )
        yield (
            json.dumps(
                {
                    "model": name,
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": reason,
                    "prompt_eval_count": prompt_tokens,
                    "eval_count": len(said),
                }
            )
            + "\n"
        )

    if body.get("stream", True):
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    return error(400, "this stand-in streams only")


async def fake_asked(_: Request) -> Response:
    return JSONResponse({**asked, "models": models})


async def fake_env(_: Request) -> Response:
    """The GPU environment `ollama serve` was started with (None: not set)."""
    names = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPS_FALLBACK_ENGINE")
    return JSONResponse({name: os.environ.get(name) for name in names})


async def fake_fail(request: Request) -> Response:
    failure["mode"] = (await request.json()).get("mode")
    return JSONResponse({"mode": failure["mode"]})


app = Starlette(
    routes=[
        Route("/", root),
        Route("/api/version", version),
        Route("/api/blobs/{digest}", blob, methods=["HEAD", "POST"]),
        Route("/api/create", create, methods=["POST"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/tags", tags),
        Route("/api/pull", pull, methods=["POST"]),
        Route("/api/chat", chat, methods=["POST"]),
        Route("/_fake/asked", fake_asked),
        Route("/_fake/fail", fake_fail, methods=["POST"]),
        Route("/_fake/env", fake_env),
    ]
)


def main() -> None:
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: ollama serve")
    host, _, port = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434").rpartition(":")
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
